"""Figures quoted from the papers, never computed: each with its source, so a notebook can
set the model beside what the authors measured.

The FlashAttention paper's Figure 2 (left) exists in two versions with different numbers,
and they must not be mixed up:

* arXiv:2205.14135v2 (dated June 24, 2022 on its first page): "GPT-2 medium (seq. length
  1024, head dim. 64, 16 heads, batch size 64) on A100 GPU"; standard attention 40.3 GB
  and 41.7 ms, FlashAttention 4.4 GB and 7.3 ms. Checked against a text of that version.
* The NeurIPS 2022 version: "seq. length 1024, head dim. 64, 16 heads, batch size 64,
  key-padding mask and no dropout on A100 GPU"; standard attention 35.3 GB and 35.1 ms,
  FlashAttention 4.4 GB and 11.7 ms. Checked against a text with this caption and these
  figures in the two-column conference layout; that text carries no venue line, so that it
  is the proceedings version rests on issue #12, not on the proceedings PDF itself.

Both give 66.6 and 75.2 GFLOPs, without saying how FLOPs are counted.
"""

_CONFIG = {"model": "GPT-2 medium", "seq_len": 1024, "head_dim": 64, "heads": 16,
           "batch": 64, "passes": "forward + backward", "gpu": "A100"}


def _figure2(version: str, source: str, caption: str, standard: tuple, flash: tuple) -> dict:
    """One version of Figure 2 (left): (GFLOPs, HBM R/W GB, runtime ms) of each method."""
    keys = ("gflops", "hbm_rw_gb", "runtime_ms")
    return {"version": version, "source": source, "caption": caption, "config": dict(_CONFIG),
            "standard": dict(zip(keys, standard)), "flash": dict(zip(keys, flash))}


# Quoted from the paper, not computed.
FLASHATTENTION_FIGURE2_ARXIV_V2 = _figure2(
    "arXiv v2", "Dao et al., FlashAttention, arXiv:2205.14135v2 (June 2022), Figure 2 (left)",
    "GPT-2 medium (seq. length 1024, head dim. 64, 16 heads, batch size 64) on A100 GPU",
    standard=(66.6, 40.3, 41.7), flash=(75.2, 4.4, 7.3))

# Quoted from the paper, not computed: Shah, Bikshandi, Zhang, Thakkar, Ramani and Dao,
# "FlashAttention-3: Fast and Accurate Attention with Asynchrony and Low-precision"
# (arXiv:2407.08608, 2024), Section 4.3 and Table 3: RMSE of each method's output against a
# float64 reference, Q, K, V with entries N(0, 1) + N(0, 100) Bernoulli(0.001). The paper
# does not state the shape. "Baseline FP8 uses per-tensor scaling, with matmul accumulator
# in FP32 and intermediate softmax results kept in FP16."
FLASHATTENTION3_TABLE3 = {
    "source": "Shah et al., FlashAttention-3 (arXiv:2407.08608), Section 4.3, Table 3",
    "inputs": "N(0,1) + N(0,100) * Bernoulli(0.001), each entry of Q, K, V",
    "reference": "attention in FP64",
    "rmse": {
        "Baseline FP16": 3.2e-4, "FlashAttention-2 FP16": 1.9e-4,
        "FlashAttention-3 FP16": 1.9e-4, "Baseline FP8": 2.4e-2,
        "FlashAttention-3 FP8": 9.1e-3, "No block quant": 9.3e-3,
        "No incoherent processing": 2.4e-2,
    },
}

# Quoted from the same paper, Section 4.2 and Table 2 (pipelining ablation): non-causal FP16
# forward, {batch, seqlen, nheads, hdim} = {4, 8448, 16, 128}, H100 SXM5 at a fixed 1830 MHz
# (Appendix C.1). FLOPs counted as 4 seqlen^2 hdim nheads batch.
FLASHATTENTION3_TABLE2 = {
    "source": "Shah et al., FlashAttention-3 (arXiv:2407.08608), Section 4.2, Table 2",
    "config": {"batch": 4, "seq_len": 8448, "heads": 16, "head_dim": 128, "causal": False,
               "dtype": "fp16", "gpu": "H100 SXM5, 1830 MHz"},
    "rows": [
        {"configuration": "FlashAttention-3", "time_ms": 3.538, "tflops": 661},
        {"configuration": "No GEMM-Softmax Pipelining, Warp-Specialization",
         "time_ms": 4.021, "tflops": 582},
        {"configuration": "GEMM-Softmax Pipelining, No Warp-Specialization",
         "time_ms": 4.105, "tflops": 570},
    ],
    # Section 3.1: "we generally find this [pingpong] to improve performance (e.g., from 570
    # TFLOPS to 620-640 TFLOPS for FP16 forward with head dimension 128 and sequence length
    # 8192)."
    "pingpong_note_tflops": {"before": 570, "after": (620, 640)},
}
# Quoted from the paper, not computed (venue: see the module docstring).
FLASHATTENTION_FIGURE2_NEURIPS = _figure2(
    "NeurIPS 2022", "Dao et al., FlashAttention, NeurIPS 2022, Figure 2 (left)",
    "seq. length 1024, head dim. 64, 16 heads, batch size 64, key-padding mask and no "
    "dropout on A100 GPU",
    standard=(66.6, 35.3, 35.1), flash=(75.2, 4.4, 11.7))
FLASHATTENTION_FIGURE2_VERSIONS = (FLASHATTENTION_FIGURE2_ARXIV_V2,
                                   FLASHATTENTION_FIGURE2_NEURIPS)
