"""Hardware presets and the roofline time estimate.

Each preset gives what the traffic model needs: how much shared memory one thread block may
use (the SRAM size M), the L2 size, HBM bandwidth and the dense peak rates. Sources are the
vendors' datasheets and the CUDA C++ Programming Guide's table of per-block shared memory
(compute capability 8.0: 163 KiB, 8.9: 99 KiB, 9.0: 227 KiB), except where a preset says
"measured". Datasheets' "MB" of L2 are binary: the H200's "60 MB" reads as
``cudaDeviceProp.l2CacheSize`` = 62,914,560 bytes on the project's machine.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import FlashsimError

KiB, MiB = 1024, 2**20
# The preset every default refers to: the GPU this project measures on.
DEFAULT_GPU = "h200"


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

    def peak_flops(self, dtype: str) -> float:
        """The rate that bounds attention's matmuls in ``dtype``."""
        return self.peak_fp32 if dtype == "fp32" else self.peak_tensor_fp16


GPUS: dict[str, GPU] = {
    "a100-40gb": GPU(
        "NVIDIA A100 40GB SXM", sms=108, sram_per_block=163 * KiB, l2_bytes=40 * MiB,
        hbm_bandwidth=1555e9, peak_tensor_fp16=312e12, peak_fp32=19.5e12,
        sram_per_sm=164 * KiB,
        hbm_capacity=40e9, hbm_kind="HBM2", boost_clock_hz=1.41e9,
        source="NVIDIA A100 datasheet (2021); CUDA Programming Guide, cc 8.0"),
    "a100-80gb": GPU(
        "NVIDIA A100 80GB SXM", sms=108, sram_per_block=163 * KiB, l2_bytes=40 * MiB,
        hbm_bandwidth=2039e9, peak_tensor_fp16=312e12, peak_fp32=19.5e12,
        sram_per_sm=164 * KiB,
        hbm_capacity=80e9, hbm_kind="HBM2e", boost_clock_hz=1.41e9,
        source="NVIDIA A100 datasheet (2021); CUDA Programming Guide, cc 8.0"),
    "h100": GPU(
        "NVIDIA H100 SXM", sms=132, sram_per_block=227 * KiB, l2_bytes=50 * MiB,
        hbm_bandwidth=3.35e12, peak_tensor_fp16=989.4e12, peak_fp32=66.9e12,
        sram_per_sm=228 * KiB,
        hbm_capacity=80e9, hbm_kind="HBM3", boost_clock_hz=1.98e9,
        source="NVIDIA H100 datasheet (2023); CUDA Programming Guide, cc 9.0"),
    "h200": GPU(
        "NVIDIA H200 SXM", sms=132, sram_per_block=227 * KiB, l2_bytes=60 * MiB,
        hbm_bandwidth=4.8e12, peak_tensor_fp16=989.4e12, peak_fp32=66.9e12,
        sram_per_sm=228 * KiB,
        hbm_capacity=141e9, hbm_kind="HBM3e", boost_clock_hz=1.98e9,
        source="NVIDIA H200 datasheet (2024); L2 (62,914,560 B) and SM count measured on "
               "the project's H200 (cudaGetDeviceProperties, benchmarks/results/ncu_h200.json); "
               "CUDA Programming Guide, cc 9.0"),
    "rtx4090": GPU(
        "NVIDIA GeForce RTX 4090", sms=128, sram_per_block=99 * KiB, l2_bytes=72 * MiB,
        hbm_bandwidth=1008e9, peak_tensor_fp16=165.2e12, peak_fp32=82.6e12,
        sram_per_sm=100 * KiB,
        hbm_capacity=24e9, hbm_kind="GDDR6X", boost_clock_hz=2.52e9,
        source="NVIDIA Ada Lovelace architecture whitepaper v1.1 (fp16 tensor rate with "
               "fp32 accumulate); CUDA Programming Guide, cc 8.9"),
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

LINKS: dict[str, Link] = {
    "a100-40gb": Link(
        "NVLink 3 (12 links)", bandwidth=300e9, latency=NCCL_P2P_LATENCY_S,
        source="NVIDIA A100 datasheet (2021): NVLink 600 GB/s, the sum of both directions "
               "of 12 links of 50 GB/s; one direction to one peer through NVSwitch: 300 GB/s"),
    "a100-80gb": Link(
        "NVLink 3 (12 links)", bandwidth=300e9, latency=NCCL_P2P_LATENCY_S,
        source="NVIDIA A100 datasheet (2021): NVLink 600 GB/s, the sum of both directions "
               "of 12 links of 50 GB/s; one direction to one peer through NVSwitch: 300 GB/s"),
    "h100": Link(
        "NVLink 4 (18 links)", bandwidth=450e9, latency=NCCL_P2P_LATENCY_S,
        source="NVIDIA H100 datasheet (2023): NVLink 900 GB/s, the sum of both directions "
               "of 18 links of 50 GB/s; one direction to one peer through NVSwitch (HGX "
               "H100): 450 GB/s"),
    "h200": Link(
        "NVLink 4 (18 links)", bandwidth=450e9, latency=NCCL_P2P_LATENCY_S,
        source="NVIDIA H200 datasheet (2024): NVLink 900 GB/s, the sum of both directions "
               "of 18 links of 50 GB/s; one direction to one peer through NVSwitch (HGX "
               "H200): 450 GB/s"),
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
    return next(k for k, v in GPUS.items() if v == g)
