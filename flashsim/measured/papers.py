"""Figures quoted from the papers, never computed: each with its source, so a notebook can
set the model beside what the authors measured."""

# Quoted from the paper, not computed: Dao, Fu, Ermon, Rudra and Ré, "FlashAttention: Fast
# and Memory-Efficient Exact Attention with IO-Awareness", NeurIPS 2022 (arXiv:2205.14135),
# Figure 2 (left): forward + backward of GPT-2 medium's attention on an A100.
FLASHATTENTION_FIGURE2 = {
    "source": "Dao et al., FlashAttention, NeurIPS 2022 (arXiv:2205.14135), Figure 2 (left)",
    "config": {"model": "GPT-2 medium", "seq_len": 1024, "head_dim": 64, "heads": 16,
               "batch": 64, "passes": "forward + backward", "gpu": "A100"},
    "standard": {"gflops": 66.6, "hbm_rw_gb": 40.3, "runtime_ms": 41.7},
    "flash": {"gflops": 75.2, "hbm_rw_gb": 4.4, "runtime_ms": 7.3},
}
