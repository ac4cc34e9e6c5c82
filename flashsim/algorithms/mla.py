"""Multi-head latent attention (DeepSeek-V2/V3) as FlashMLA runs it: one latent cache for all heads.

Versions: one. With the up-projections absorbed into the query and the output, every
query head attends to the same cache: per token one latent vector c_KV (d_c = 512) and
one shared rotary key k_rope (d_rope = 64), stored together as one row of d_c + d_rope =
576 elements. QK^T uses all 576 dimensions (the absorbed q_nope W_UK and q_rope against
[c_KV, k_rope]), PV the first 512 (the latent vector is the value). So the cache is one KV
"head" for all H query heads: g = H, and the H q_len query rows are packed into tiles of
64 rows as FlashMLA does. Softmax scale 1/sqrt(d_nope + d_rope) = 1/sqrt(192) (the
model's query-key head dimension before absorption).

It runs on kvcache.py's nest with a shared K/V tensor ``KV`` (V_j = K_j[:, :d_c], one load
per tile) and flashdecoding.py's splits. Per copy (one sequence; kv_heads = 1):

    read  KV: (G / B_r) n (d_c + d_rope) b        G = H q_len, B_r = 64 when H q_len >= 64
    FLOPs 2 (d_c + d_rope + d_c) G n
    (Q, O, partials and the combine as in kvcache.py and flashdecoding.py with d = 576,
    d_v = 512)

Bytes of cache per token, per layer (``cache_bytes_per_token``), b bytes per element:
MHA 2 H d b, GQA 2 kv_heads d b, MQA 2 d b, MLA (d_c + d_rope) b — DeepSeek-V3 (H = 128,
d = 128) in bf16: 65,536 B against 1,152 B.
"""

from __future__ import annotations

import math

# DeepSeek-V3's attention dimensions (config.json of deepseek-ai/DeepSeek-V3:
# kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128, num_attention_heads 128)
LATENT_DIM = 512
ROPE_DIM = 64
NOPE_DIM = 128
HEADS = 128


def dims(latent_dim: int = LATENT_DIM, rope_dim: int = ROPE_DIM) -> tuple[int, int]:
    """(QK dimensions, PV dimensions) of the absorbed attention: (576, 512) by default."""
    return latent_dim + rope_dim, latent_dim


def scale(nope_dim: int = NOPE_DIM, rope_dim: int = ROPE_DIM) -> float:
    """The softmax scale DeepSeek uses: 1/sqrt(qk_nope_head_dim + qk_rope_head_dim)."""
    return 1.0 / math.sqrt(nope_dim + rope_dim)


def cache_bytes_per_token(kind: str, heads: int, head_dim: int, kv_heads: int, b: int,
                          latent_dim: int = LATENT_DIM, rope_dim: int = ROPE_DIM) -> int:
    """K/V cache bytes one token adds per layer: ``kind`` mha, gqa, mqa or mla."""
    return {"mha": 2 * heads * head_dim * b, "gqa": 2 * kv_heads * head_dim * b,
            "mqa": 2 * head_dim * b, "mla": (latent_dim + rope_dim) * b}[kind]
