"""Python API of the CuPy RawModule attention kernels (one module per algorithm).

    from gpu_kernels.cupy_attention import (standard_attention, flash1_attention,
                                            flash2_attention, flash2_tc_attention)

fp32 SIMT kernels: ``standard_attention`` (three launches, S and P in HBM),
``flash1_attention`` (FlashAttention, K/V outer loop), ``flash2_attention``
(FlashAttention-2). Tensor cores, fp16/bf16: ``flash2_tc_attention``. All take (B, H, N, d)
CuPy arrays or PyTorch CUDA tensors and validate them before launching.
"""

from .cupy_common import KernelInputError
from .cupy_flash1 import flash1_attention
from .cupy_flash2 import flash2_attention
from .cupy_flash2_tc import flash2_tc_attention
from .cupy_standard import standard_attention

__all__ = ["standard_attention", "flash1_attention", "flash2_attention", "flash2_tc_attention",
           "KernelInputError"]
