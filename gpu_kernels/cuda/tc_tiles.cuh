// The compile-time constants the tensor-core kernels (flash2_tc.cu, flash3.cu) take from
// their loaders (gpu_kernels/cupy/flash2_tc.py, flash3.py: -DHEAD_DIM=... and so on), with
// the values a file compiles with on its own: d = 128, B_r x B_c = 128 x 64, fp16.
#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef BLOCK_R
#define BLOCK_R 128
#endif
#ifndef BLOCK_C
#define BLOCK_C 64
#endif
#ifndef IS_BF16
#define IS_BF16 0
#endif
