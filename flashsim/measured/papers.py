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

# Quoted from the paper, not computed.
FLASHATTENTION_FIGURE2_ARXIV_V2 = {
    "version": "arXiv v2",
    "source": "Dao et al., FlashAttention, arXiv:2205.14135v2 (June 2022), Figure 2 (left)",
    "caption": "GPT-2 medium (seq. length 1024, head dim. 64, 16 heads, batch size 64) on "
               "A100 GPU",
    "config": dict(_CONFIG),
    "standard": {"gflops": 66.6, "hbm_rw_gb": 40.3, "runtime_ms": 41.7},
    "flash": {"gflops": 75.2, "hbm_rw_gb": 4.4, "runtime_ms": 7.3},
}

# Quoted from the paper, not computed (venue: see the module docstring).
FLASHATTENTION_FIGURE2_NEURIPS = {
    "version": "NeurIPS 2022",
    "source": "Dao et al., FlashAttention, NeurIPS 2022, Figure 2 (left)",
    "caption": "seq. length 1024, head dim. 64, 16 heads, batch size 64, key-padding mask "
               "and no dropout on A100 GPU",
    "config": dict(_CONFIG),
    "standard": {"gflops": 66.6, "hbm_rw_gb": 35.3, "runtime_ms": 35.1},
    "flash": {"gflops": 75.2, "hbm_rw_gb": 4.4, "runtime_ms": 11.7},
}

FLASHATTENTION_FIGURE2_VERSIONS = (FLASHATTENTION_FIGURE2_ARXIV_V2,
                                   FLASHATTENTION_FIGURE2_NEURIPS)
