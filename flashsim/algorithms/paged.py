"""PagedAttention (Kwon et al., vLLM, SOSP 2023): the KV cache in pages of P tokens.

Versions: one. The cache is a pool of pages; sequence b's logical token r lives in page
``block_table[b, r // P]`` at slot r mod P, pages scattered anywhere in the pool. Each
K/V tile first reads the block-table entries of the pages it touches (int32), then the
tile's rows from those pages. It runs on kvcache.py's nest (with or without splits); only
the table is new. P must divide B_c or be a multiple of it, as in the kernels (a tile
covers whole pages, or lies inside one).

Table traffic per copy of sequence b (n keys, pages n_p = ceil(n / P)), per Q tile and
split of the sequence (G / B_r Q tiles; each reads its own split's entries):

    P divides B_c:   4 n_p bytes per Q tile              (each page's entry once)
    B_c divides P:   4 T_c bytes per Q tile              (each tile re-reads its page's
                                                          entry; T_c = ceil(n / B_c))

The K/V bytes are those of a contiguous cache: a page holds P d b contiguous bytes (a
multiple of the 32-byte sector for d b >= 32), so only rows a kernel uses are read, the
last page's unused slots included in memory, not in traffic. Memory (``fragmentation``):
paged keeps sum_b P n_p rows of K and V (the last page's waste, P - 1 rows at most per
sequence); a contiguous cache reserves its capacity (the longest sequence, or a stated
maximum) for every sequence.
"""

from __future__ import annotations

from ..nest import Load, Loop, Tensor
from ..units import cdiv

TABLE_BYTES = 4                   # int32 block-table entries, as vLLM and FlashInfer


def pages_per_step(page_size: int, block_cols: int) -> int:
    """Pages one K/V tile touches (1 when the tile lies inside one page)."""
    return max(1, block_cols // page_size)


def table_ops(dp):
    """``extra_j`` for kvcache.split_launch: the table entries of a tile, read first."""
    P, Bc = dp.page_size, dp.block_cols
    kp = pages_per_step(P, Bc)

    def ops(b, n, x, jv, tensors):
        pv = f"p{b}"
        tensors["block_table" + x] = Tensor("block_table" + x, cdiv(n, P), 1, TABLE_BYTES)
        first = lambda ctx: (ctx.idx[jv] * Bc) // (kp * P)          # noqa: E731
        return (Loop(pv, kp, cdiv(n, P), start=first, stop=lambda ctx: first(ctx) + 1,
                     label="block-table entries of the tile",
                     body=(Load("pages", "block_table" + x, rows=pv),)),)
    return ops


def table_closed_form(dp) -> dict:
    """Block-table bytes read per copy, from the header."""
    from .kvcache import split_geometry, suffix
    P, Bc, nQ = dp.page_size, dp.block_cols, dp.group_rows // dp.block_rows
    out = {}
    for b, n in enumerate(dp.seqs):
        tiles = split_geometry(n, Bc, dp.splits)[0]
        entries = cdiv(n, P) if Bc % P == 0 else tiles
        out["block_table" + suffix(dp, b)] = TABLE_BYTES * nQ * entries
    return out


def fragmentation(kv_lens, page_size: int, row_bytes: int, capacity: int | None = None
                  ) -> dict:
    """KV-cache memory of a batch, bytes: ``used`` (the tokens), ``paged`` (whole pages),
    ``contiguous`` (every sequence reserves ``capacity`` tokens, default the longest), and
    the waste of each. ``row_bytes``: K and V bytes of one token (all KV heads)."""
    lens = [int(n) for n in kv_lens]
    cap = max(lens) if capacity is None else int(capacity)
    used = sum(lens) * row_bytes
    paged = sum(cdiv(n, page_size) * page_size for n in lens) * row_bytes
    contiguous = cap * len(lens) * row_bytes
    return {"used": used, "paged": paged, "contiguous": contiguous,
            "paged_waste": paged - used, "contiguous_waste": contiguous - used}
