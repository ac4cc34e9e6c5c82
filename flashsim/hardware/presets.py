"""Hardware presets and the roofline time estimate.

Each preset gives what the traffic model needs: how much shared memory one thread block may
use (the SRAM size M), the L2 size, HBM bandwidth and the dense peak rates. Sources are the
vendors' datasheets and the CUDA C++ Programming Guide's table of per-block shared memory
(compute capability 8.0: 163 KiB, 8.9: 99 KiB, 9.0: 227 KiB), except where a preset says
"measured". Datasheets' "MB" of L2 are binary: the H200's "60 MB" reads as
``cudaDeviceProp.l2CacheSize`` = 62,914,560 bytes on the project's machine.

Four levels, from the SM outwards (sizes per SM unless a name says otherwise):

* **registers**: 64K 32-bit registers per SM (256 KiB), at most 255 per thread and 64K per
  block (the Programming Guide's "Technical Specifications per Compute Capability", the same
  for cc 8.0, 8.9 and 9.0). A kernel's tiles of S_ij and its O_i accumulator live here.
  What one block may hold is set by its warps: ``warps_per_block`` x 32 threads x 255
  registers x 4 bytes, at most 64K registers. The presets take FlashAttention-2's forward
  kernels, 4 warps a block (flash-attention, csrc/flash_attn/src/flash_fwd_launch_template.h:
  ``Flash_fwd_kernel_traits<d, 128, 64, 4, ...>`` for d = 128 and ``<d, 128, 128, 4, ...>``
  for d = 64 on sm80/sm90): 130,560 bytes, an upper bound, since a real kernel also keeps
  addresses, indices and loop counters in registers.
* **shared memory**, carved out of the SM's L1 (``l1_shared_per_sm``: 192 KB on an A100,
  256 KB on an H100/H200, the architecture whitepapers): up to ``sram_per_sm`` of it is
  shared memory, and one block may use ``sram_per_block``. That per-block figure is what
  flashsim calls M. The FlashAttention paper's "192 KB of on-chip SRAM per SM" is the whole
  L1 + shared capacity of an A100 SM, and its "about 20 MB" is that times 108 SMs.
* **L2** (``l2_bytes``), shared by all SMs; **HBM** (DRAM) behind it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import FlashsimError

KiB, MiB = 1024, 2**20
# The preset every default refers to: the GPU this project measures on.
DEFAULT_GPU = "h200"
REGISTER_SOURCE = (
    "CUDA C++ Programming Guide, Technical Specifications per Compute Capability (64K "
    "32-bit registers per SM and per block, 255 per thread); 4 warps per block as "
    "FlashAttention-2's forward kernels (flash-attention, csrc/flash_attn/src/"
    "flash_fwd_launch_template.h)")


@dataclass(frozen=True)
class GPU:
    name: str
    sms: int
    sram_per_block: int          # bytes of shared memory one block may use (opt-in maximum)
    l2_bytes: int
    hbm_bandwidth: float         # bytes/s
    peak_tensor_fp16: float      # dense FLOP/s, fp16/bf16 inputs, fp32 accumulate
    peak_fp32: float             # FLOP/s on the plain fp32 units (no TF32)
    source: str
    sram_per_sm: int = 0         # shared memory of one SM, shared by its resident blocks
    hbm_capacity: float = 0.0    # bytes of device memory (datasheet, decimal GB)
    hbm_kind: str = ""           # the memory technology, for tables
    boost_clock_hz: float = 0.0  # SM boost clock (datasheet)
    # Per SM and clock cycle, for the work outside HBM (see ``unit_rates``): dense fp16/bf16
    # tensor-core FLOPs (fp32 accumulate), special-function results (exp2, log2, rcp, ...),
    # and fp32 results on the plain (non-tensor) units (add, mul, max: one op each).
    tensor_flops_per_clk_sm: int = 0
    sfu_ops_per_clk_sm: int = 0
    fp32_ops_per_clk_sm: int = 0
    tensor_fp8_flops_per_clk_sm: int = 0     # e4m3/e5m2 inputs (Hopper: twice fp16)
    unit_source: str = ""
    l1_shared_per_sm: int = 0    # the SM's L1 + shared-memory capacity (architecture whitepaper)
    registers_per_sm: int = 65536            # 32-bit registers of one SM
    max_registers_per_thread: int = 255
    max_registers_per_block: int = 65536
    warps_per_block: int = 4     # FlashAttention-2's forward kernels (see the module docstring)
    register_source: str = REGISTER_SOURCE

    @property
    def register_bytes_per_block(self) -> int:
        """Bytes of registers one block of ``warps_per_block`` warps may hold (4-byte
        registers): the register budget of the default tile rule."""
        regs = min(self.warps_per_block * 32 * self.max_registers_per_thread,
                   self.max_registers_per_block, self.registers_per_sm)
        return 4 * regs

    @property
    def register_bytes_per_sm(self) -> int:
        return 4 * self.registers_per_sm

    def peak_flops(self, dtype: str) -> float:
        """The rate that bounds attention's matmuls in ``dtype``."""
        return self.peak_fp32 if dtype == "fp32" else self.peak_tensor_fp16

    @property
    def tensor_clock_hz(self) -> float:
        """The SM clock at which the datasheet's dense fp16 tensor peak is quoted:
        peak / (SMs x tensor FLOPs per clock per SM). The unit rates below use it, so that
        they stand in the same ratio as the hardware's per-clock throughputs (the H100's
        989.4 TFLOP/s are quoted at 1.83 GHz, its fp32 66.9 TFLOP/s at 1.98 GHz)."""
        if not self.tensor_flops_per_clk_sm:
            raise FlashsimError(f"{self.name}: no per-clock unit throughputs in the preset")
        return self.peak_tensor_fp16 / (self.sms * self.tensor_flops_per_clk_sm)

    def unit_rates(self) -> dict:
        """Operations per second of each unit of the whole GPU at ``tensor_clock_hz``:
        ``tensor`` (fp16 FLOPs, dense), ``tensor_fp8`` (twice that on cc 9.0), ``sfu``
        (exponentials), ``fp32`` (non-tensor fp32 operations), ``hbm`` (bytes)."""
        clk = self.tensor_clock_hz * self.sms
        rates = {"tensor": self.tensor_flops_per_clk_sm * clk,
                 "sfu": self.sfu_ops_per_clk_sm * clk,
                 "fp32": self.fp32_ops_per_clk_sm * clk,
                 "hbm": self.hbm_bandwidth}
        if self.tensor_fp8_flops_per_clk_sm:
            rates["tensor_fp8"] = self.tensor_fp8_flops_per_clk_sm * clk
        return rates


_A100 = GPU(
    "NVIDIA A100 40GB SXM", sms=108, sram_per_block=163 * KiB, l2_bytes=40 * MiB,
    hbm_bandwidth=1555e9, peak_tensor_fp16=312e12, peak_fp32=19.5e12,
    sram_per_sm=164 * KiB,
    hbm_capacity=40e9, hbm_kind="HBM2", boost_clock_hz=1.41e9,
    tensor_flops_per_clk_sm=2048, sfu_ops_per_clk_sm=16, fp32_ops_per_clk_sm=64,
    unit_source="CUDA C++ Programming Guide, Arithmetic Instructions (cc 8.0: 64 fp32 and 16 "
                "special-function results per clock per SM); A100 whitepaper (1024 dense "
                "fp16 FMA per clock per SM)",
    l1_shared_per_sm=192 * KiB,
    source="NVIDIA A100 datasheet (2021); A100 architecture whitepaper (192 KB L1 + "
           "shared per SM); CUDA Programming Guide, cc 8.0")
_H100 = GPU(
    "NVIDIA H100 SXM", sms=132, sram_per_block=227 * KiB, l2_bytes=50 * MiB,
    hbm_bandwidth=3.35e12, peak_tensor_fp16=989.4e12, peak_fp32=66.9e12,
    sram_per_sm=228 * KiB,
    hbm_capacity=80e9, hbm_kind="HBM3", boost_clock_hz=1.98e9,
    tensor_flops_per_clk_sm=4096, sfu_ops_per_clk_sm=16, fp32_ops_per_clk_sm=128,
    tensor_fp8_flops_per_clk_sm=8192,
    unit_source="CUDA C++ Programming Guide, Arithmetic Instructions (cc 9.0: 128 fp32 and 16 "
                "special-function results per clock per SM); H100 whitepaper (dense fp16 "
                "989.4 TFLOP/s = 132 SMs x 1.83 GHz x 4096 FLOP per clock, fp8 twice "
                "that; the FlashAttention-3 paper's 3.9 TFLOP/s of special functions is "
                "132 x 1.83 GHz x 16)",
    l1_shared_per_sm=256 * KiB,
    source="NVIDIA H100 datasheet (2023); H100 architecture whitepaper (256 KB L1 + "
           "shared per SM); CUDA Programming Guide, cc 9.0")

GPUS: dict[str, GPU] = {
    "a100-40gb": _A100,
    # the same chip and L2 with HBM2e: faster and larger memory
    "a100-80gb": replace(
        _A100, name="NVIDIA A100 80GB SXM", hbm_bandwidth=2039e9, hbm_capacity=80e9,
        hbm_kind="HBM2e",
        source="NVIDIA A100 datasheet (2021); A100 architecture whitepaper (192 KB L1 + "
               "shared per SM); CUDA Programming Guide, cc 8.0"),
    "h100": _H100,
    # the H100's SM with a larger L2 and HBM3e
    "h200": replace(
        _H100, name="NVIDIA H200 SXM", l2_bytes=60 * MiB, hbm_bandwidth=4.8e12,
        hbm_capacity=141e9, hbm_kind="HBM3e",
        source="NVIDIA H200 datasheet (2024); L2 (62,914,560 B) and SM count measured on "
               "the project's H200 (cudaGetDeviceProperties, benchmarks/results/ncu_h200.json); "
               "H100 architecture whitepaper (the same SM: 256 KB L1 + shared); "
               "CUDA Programming Guide, cc 9.0"),
    "rtx4090": GPU(
        "NVIDIA GeForce RTX 4090", sms=128, sram_per_block=99 * KiB, l2_bytes=72 * MiB,
        hbm_bandwidth=1008e9, peak_tensor_fp16=165.2e12, peak_fp32=82.6e12,
        sram_per_sm=100 * KiB,
        hbm_capacity=24e9, hbm_kind="GDDR6X", boost_clock_hz=2.52e9,
        tensor_flops_per_clk_sm=512, sfu_ops_per_clk_sm=16, fp32_ops_per_clk_sm=128,
        unit_source="CUDA C++ Programming Guide, Arithmetic Instructions (cc 8.9: 128 fp32 and 16 "
                    "special-function results per clock per SM); Ada whitepaper (fp16 with fp32 "
                    "accumulate 165.2 TFLOP/s = 128 SMs x 2.52 GHz x 512)",
        l1_shared_per_sm=128 * KiB,
        source="NVIDIA Ada Lovelace architecture whitepaper v1.1 (fp16 tensor rate with "
               "fp32 accumulate; 128 KB L1 + shared per SM); CUDA Programming Guide, cc 8.9"),
}


def gpu(name: str) -> GPU:
    """The preset called ``name`` (case-insensitive)."""
    try:
        return GPUS[str(name).lower()]
    except KeyError:
        raise FlashsimError(
            f"unknown GPU {name!r}: choose one of {', '.join(GPUS)}") from None


def roofline_time(hbm_bytes: float, flops: float, preset: GPU, dtype: str) -> float:
    """Seconds: the larger of moving the bytes at full bandwidth and doing the FLOPs at peak.

    A floor, not a forecast: it assumes perfect overlap and every SM busy.
    """
    return max(hbm_bytes / preset.hbm_bandwidth, flops / preset.peak_flops(dtype))


# ----------------------------------------------------------------- links between GPUs

@dataclass(frozen=True)
class Link:
    """What one direction of one ring link between two GPUs carries (context parallelism:
    device p sends to p + 1 while it receives from p - 1, so each direction carries one
    transfer at a time)."""
    name: str
    bandwidth: float             # bytes/s, one direction
    latency: float               # seconds per transfer (a send/receive pair)
    source: str


# A transfer's fixed cost: NCCL's own tuning model (NVIDIA/nccl, src/graph/tuning.cc)
# charges a ring step with its Simple protocol a base latency of 8.4 us plus a few us per
# NVLink hop (LL128: 2.5, Simple: 3.4-5.7 us, by version); 10 us is that order, an
# estimate rather than a measurement.
NCCL_P2P_LATENCY_S = 10e-6

_NVLINK3 = Link(
    "NVLink 3 (12 links)", bandwidth=300e9, latency=NCCL_P2P_LATENCY_S,
    source="NVIDIA A100 datasheet (2021): NVLink 600 GB/s, the sum of both directions "
           "of 12 links of 50 GB/s; one direction to one peer through NVSwitch: 300 GB/s")
_NVLINK4 = Link(
    "NVLink 4 (18 links)", bandwidth=450e9, latency=NCCL_P2P_LATENCY_S,
    source="NVIDIA H100 datasheet (2023): NVLink 900 GB/s, the sum of both directions "
           "of 18 links of 50 GB/s; one direction to one peer through NVSwitch (HGX "
           "H100): 450 GB/s")

LINKS: dict[str, Link] = {
    "a100-40gb": _NVLINK3,
    "a100-80gb": _NVLINK3,
    "h100": _NVLINK4,
    "h200": replace(_NVLINK4, source=(
        "NVIDIA H200 datasheet (2024): NVLink 900 GB/s, the sum of both directions of 18 "
        "links of 50 GB/s; one direction to one peer through NVSwitch (HGX H200): 450 GB/s")),
    "rtx4090": Link(
        "PCIe 4.0 x16 (no NVLink)", bandwidth=32e9, latency=NCCL_P2P_LATENCY_S,
        source="Ada Lovelace has no NVLink; PCIe 4.0 x16: 64 GB/s both directions, 32 GB/s "
               "one way (GeForce cards disable peer-to-peer, so NCCL stages through host "
               "memory and gets less)"),
}


def link(name: str) -> Link:
    """The GPU-to-GPU link of the preset called ``name`` (case-insensitive)."""
    gpu(name)                                    # one error for an unknown name
    return LINKS[str(name).lower()]


def preset_name(g: GPU) -> str:
    """The key of preset ``g`` in :data:`GPUS`."""
    return next(k for k, v in GPUS.items() if v.name == g.name)   # g may have other warps
