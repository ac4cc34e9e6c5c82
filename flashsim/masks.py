"""Attention masks as FlashMask writes them, and what they cost: tiles skipped, bytes carried.

**The representation** (FlashMask, Wang et al. 2024, arXiv:2410.01359): for every key column
c, two half-open ranges of query rows that are masked,

    lower-triangle rows [LTS_c, LTE_c)     upper-triangle rows [UTS_c, UTE_c)

four int32 vectors of length N: 16 N bytes, against the N^2 bytes of a dense boolean mask.
Query r sees key c unless r lies in one of column c's two ranges. An empty range is written
[N, N) below and [0, 0) above. Every family is built from these vectors except the
block-sparse one, whose random pattern of blocks is not two ranges per column:

    causal                 UT [0, c)                         query r sees keys c <= r
    sliding:W              UT [0, c), LT [c + W, N)          r - W < c <= r: the W keys
                                                             before and including r
    document:L1,L2,...     LT [e, N), UT [0, s)              block-diagonal: doc [s, e)
    document:...:causal    LT [e, N), UT [0, c)              causal inside each document
    prefix:P               c < P: none; c >= P: UT [0, c)    bidirectional prefix, then causal
    padding:V              c >= V: LT [0, N)                 keys past V hidden (key padding)
    blocksparse:S:SEED     a random pattern of round(S T_r T_c) of the T_r x T_c tiles (at
                           least one), drawn with SEED at the plan's tiles (Proposition 4)

**Tiles** (:meth:`Mask.classify`): with per-column-block minima and maxima of the four
vectors, tile (i, j) of rows [r0, r1) is *skipped* when it lies inside one range for every
column of the block, r0 >= max LTS and r1 <= min LTE (or the same with UT); *full* when it
meets neither range for any column, (r1 <= min LTS or r0 >= max LTE) and the same with UT;
else *partial* (computed, then masked element by element). Skipped tiles move no bytes and
do no FLOPs. The test is FlashMask's and is conservative: a tile it calls partial may hold
no masked element, never the other way round.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

import numpy as np

from .errors import FlashsimError
from .nest import Visited
from .units import cdiv

SKIP, PARTIAL, FULL = 0, 1, 2
FAMILIES = ("causal", "sliding", "document", "prefix", "padding", "blocksparse")
# Classification holds one byte per tile: at most this many tiles (N = 512K at 128 x 128).
MAX_MASK_TILES = 2**24
VECTOR_BYTES = 4 * 4                       # FlashMask: four int32 per key column


class MaskError(FlashsimError):
    """A mask that cannot be built: a bad spec, out-of-range or inverted vectors."""


@dataclass(frozen=True, eq=False)
class Mask:
    """A mask over N query rows and N key columns (self-attention).

    ``lts, lte, uts, ute``: the FlashMask vectors, (N,) int64 each (None for block-sparse);
    ``density``, ``seed``: the block-sparse pattern's. ``spec``: the canonical text."""
    spec: str
    n: int
    lts: np.ndarray | None = None
    lte: np.ndarray | None = None
    uts: np.ndarray | None = None
    ute: np.ndarray | None = None
    density: float | None = None
    seed: int | None = None
    _cache: dict = field(default_factory=dict, repr=False)   # tiles, visits, key

    def __eq__(self, other):
        return isinstance(other, Mask) and self.key() == other.key()

    def __hash__(self):
        return hash(self.key())

    def key(self) -> tuple:
        """What identifies the mask: its spec, N, and a digest of the vectors (computed once:
        a plan holding the mask is hashed and compared as a whole)."""
        if "key" not in self._cache:
            vec = "" if self.lts is None else hashlib.sha256(b"".join(
                v.tobytes() for v in (self.lts, self.lte, self.uts, self.ute))).hexdigest()
            self._cache["key"] = (self.spec, self.n, self.density, self.seed, vec)
        return self._cache["key"]

    # -- tiles ---------------------------------------------------------------------------
    def classify(self, block_rows: int, block_cols: int) -> np.ndarray:
        """(T_r, T_c) int8 of SKIP, PARTIAL, FULL (see the module docstring)."""
        key = (block_rows, block_cols)
        if key not in self._cache:
            self._cache[key] = self._classify(block_rows, block_cols)
        return self._cache[key]

    def _classify(self, Br: int, Bc: int) -> np.ndarray:
        n = self.n
        Tr, Tc = cdiv(n, Br), cdiv(n, Bc)
        if Tr * Tc > MAX_MASK_TILES:
            raise MaskError(f"mask {self.spec}: {Tr:,} x {Tc:,} tiles, more than the "
                            f"{MAX_MASK_TILES:,} the model classifies; use larger blocks or "
                            "a smaller N")
        if self.lts is None:
            return np.where(self.pattern(Br, Bc), FULL, SKIP).astype(np.int8)
        starts = np.arange(0, n, Bc)
        lo = {k: np.minimum.reduceat(v, starts) for k, v in self._vectors().items()}
        hi = {k: np.maximum.reduceat(v, starts) for k, v in self._vectors().items()}
        r0 = (np.arange(Tr) * Br)[:, None]
        r1 = np.minimum(r0 + Br, n)
        skip = (((r0 >= hi["lts"]) & (r1 <= lo["lte"]))
                | ((r0 >= hi["uts"]) & (r1 <= lo["ute"])))
        full = (((r1 <= lo["lts"]) | (r0 >= hi["lte"]))
                & ((r1 <= lo["uts"]) | (r0 >= hi["ute"])))
        return np.where(skip, SKIP, np.where(full, FULL, PARTIAL)).astype(np.int8)

    def pattern(self, Br: int, Bc: int) -> np.ndarray:
        """Block-sparse only: the (T_r, T_c) bool pattern of non-zero tiles, drawn with the
        seed: exactly round(density T_r T_c) tiles (at least one)."""
        Tr, Tc = cdiv(self.n, Br), cdiv(self.n, Bc)
        k = max(1, round(self.density * Tr * Tc))
        chosen = np.random.default_rng(self.seed).permutation(Tr * Tc)[:k]
        out = np.zeros(Tr * Tc, dtype=bool)
        out[chosen] = True
        return out.reshape(Tr, Tc)

    def visible(self, rows: tuple[int, int], cols: tuple[int, int], block_rows: int,
                block_cols: int) -> np.ndarray:
        """(r1 - r0, c1 - c0) bool: query r sees key c, for r in ``rows``, c in ``cols``
        (global, half-open). The tiles matter only to block-sparse masks."""
        return self.at(np.arange(*rows)[:, None], np.arange(*cols)[None, :], block_rows,
                       block_cols)

    def at(self, r, c, block_rows: int = 1, block_cols: int = 1) -> np.ndarray:
        """Whether query ``r`` sees key ``c``, for index arrays that broadcast (a sampled
        picture of a long mask, say)."""
        r, c = np.asarray(r), np.asarray(c)
        if self.lts is None:
            return self.pattern(block_rows, block_cols)[r // block_rows, c // block_cols]
        hidden = (((r >= self.lts[c]) & (r < self.lte[c]))
                  | ((r >= self.uts[c]) & (r < self.ute[c])))
        return ~hidden

    def dense(self, block_rows: int | None = None, block_cols: int | None = None
              ) -> np.ndarray:
        """The (N, N) bool matrix of what each query sees: the reference's mask and what a
        baseline reads from HBM."""
        return self.visible((0, self.n), (0, self.n), block_rows or 1, block_cols or 1)

    def _vectors(self) -> dict:
        return {"lts": self.lts, "lte": self.lte, "uts": self.uts, "ute": self.ute}

    # -- visits --------------------------------------------------------------------------
    def visited_cols(self, block_rows: int, block_cols: int) -> list[Visited]:
        """For each Q block i, the K/V blocks j of its non-skipped tiles, ascending
        (computed once per tiling)."""
        key = ("cols", block_rows, block_cols)
        if key not in self._cache:
            self._cache[key] = [Visited(int(j) for j in np.flatnonzero(row))
                                for row in self.classify(block_rows, block_cols)]
        return self._cache[key]

    def visited_rows(self, block_rows: int, block_cols: int) -> list[Visited]:
        """For each K/V block j, the Q blocks i of its non-skipped tiles, ascending
        (computed once per tiling)."""
        key = ("rows", block_rows, block_cols)
        if key not in self._cache:
            self._cache[key] = [Visited(int(i) for i in np.flatnonzero(col))
                                for col in self.classify(block_rows, block_cols).T]
        return self._cache[key]

    def tiles_per_query_block(self, block_rows: int, block_cols: int
                              ) -> tuple[np.ndarray, np.ndarray]:
        """(visited (T_r,), partial (T_r,)): for each Q block i, its non-skipped tiles and,
        of those, the partial ones (what a kernel that skips loads and masks)."""
        t = self.classify(block_rows, block_cols)
        return (t != SKIP).sum(axis=1), (t == PARTIAL).sum(axis=1)

    def non_skipped_fraction(self, block_rows: int, block_cols: int) -> float:
        """s: the fraction of tiles computed (Proposition 4's fraction of non-zero blocks)."""
        t = self.classify(block_rows, block_cols)
        return float((t != SKIP).mean())


# -- constructors --------------------------------------------------------------------------
def from_vectors(lts, lte, uts, ute, spec: str = "flashmask") -> Mask:
    """A mask from FlashMask's four vectors (each (N,) of whole numbers in [0, N], with
    LTS <= LTE and UTS <= UTE); refused with one MaskError otherwise."""
    vecs = []
    for name, v in (("LTS", lts), ("LTE", lte), ("UTS", uts), ("UTE", ute)):
        a = np.asarray(v)
        if a.ndim != 1 or a.dtype.kind not in "iu":
            raise MaskError(f"FlashMask {name} must be a 1-D array of whole numbers, got "
                            f"shape {a.shape} dtype {a.dtype}")
        vecs.append(a.astype(np.int64))
    n = len(vecs[0])
    if n == 0 or any(len(v) != n for v in vecs):
        raise MaskError(f"FlashMask vectors must have one equal, positive length N, got "
                        f"{[len(v) for v in vecs]}")
    for name, v in zip(("LTS", "LTE", "UTS", "UTE"), vecs):
        bad = np.flatnonzero((v < 0) | (v > n))
        if len(bad):
            raise MaskError(f"FlashMask {name}[{bad[0]}] = {v[bad[0]]} is out of range: "
                            f"rows run from 0 to N = {n}")
    for (a, b), (na, nb) in (((vecs[0], vecs[1]), ("LTS", "LTE")),
                             ((vecs[2], vecs[3]), ("UTS", "UTE"))):
        bad = np.flatnonzero(a > b)
        if len(bad):
            raise MaskError(f"FlashMask range inverted at column {bad[0]}: {na} = "
                            f"{a[bad[0]]} > {nb} = {b[bad[0]]}")
    return Mask(spec, n, *vecs)


def _empty(n: int):
    return np.full(n, n), np.full(n, n), np.zeros(n, np.int64), np.zeros(n, np.int64)


def causal(n: int) -> Mask:
    lts, lte, uts, _ = _empty(n)
    return from_vectors(lts, lte, uts, np.arange(n), "causal")


def sliding(n: int, window: int) -> Mask:
    """Query r sees keys r - W < c <= r: the W keys before it, itself included."""
    window = _positive(window, "sliding window W")
    c = np.arange(n)
    return from_vectors(np.minimum(c + window, n), np.full(n, n), np.zeros(n, np.int64), c,
                        f"sliding:{window}")


def document(n: int, lengths, causal_inside: bool = False) -> Mask:
    """Packed documents of ``lengths`` (summing to N): block-diagonal, causal inside each
    when ``causal_inside``."""
    lengths = [_positive(x, "document length") for x in lengths]
    if not lengths or sum(lengths) != n:
        raise MaskError(f"document lengths {lengths} sum to {sum(lengths)}, not N = {n}")
    ends = np.cumsum(lengths)
    starts = ends - np.asarray(lengths)
    doc = np.repeat(np.arange(len(lengths)), lengths)
    c = np.arange(n)
    ute = c if causal_inside else starts[doc]
    spec = "document:" + ",".join(map(str, lengths)) + (":causal" if causal_inside else "")
    return from_vectors(ends[doc], np.full(n, n), np.zeros(n, np.int64), ute, spec)


def prefix(n: int, p: int) -> Mask:
    """Keys c < P seen by every query (a bidirectional prefix); causal after."""
    p = _positive(p, "prefix length P")
    if p > n:
        raise MaskError(f"prefix length P = {p} is more than N = {n}")
    lts, lte, uts, _ = _empty(n)
    c = np.arange(n)
    return from_vectors(lts, lte, uts, np.where(c < p, 0, c), f"prefix:{p}")


def padding(n: int, valid: int) -> Mask:
    """Key padding: keys c >= V hidden from every query (V = N hides nothing)."""
    valid = _positive(valid, "valid length V")
    if valid > n:
        raise MaskError(f"valid length V = {valid} is more than N = {n}")
    lts, lte, uts, ute = _empty(n)
    pad = np.arange(n) >= valid
    return from_vectors(np.where(pad, 0, lts), lte, uts, ute, f"padding:{valid}")


def blocksparse(n: int, density: float, seed: int = 0) -> Mask:
    """A random pattern of the plan's tiles, a fraction ``density`` in (0, 1] of them
    non-zero (the FlashAttention paper's block-sparse FlashAttention)."""
    if isinstance(density, bool) or not isinstance(density, (int, float)) \
            or not 0 < density <= 1:
        raise MaskError(f"block-sparse density must be a fraction in (0, 1], got {density!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise MaskError(f"block-sparse seed must be a whole number from 0, got {seed!r}")
    return Mask(f"blocksparse:{density:g}:{seed}", n, density=float(density), seed=seed)


def _positive(x, what: str) -> int:
    if isinstance(x, str):
        if not x.strip().isdigit():
            raise MaskError(f"{what} must be a positive whole number, got {x!r}")
        x = int(x)
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x <= 0:
        raise MaskError(f"{what} must be a positive whole number, got {x!r}")
    return int(x)


def parse(spec, n: int) -> Mask:
    """A :class:`Mask` for N from a spec (see the module docstring) or a Mask of that N."""
    if isinstance(spec, Mask):
        if spec.n != n:
            raise MaskError(f"mask {spec.spec} is for N = {spec.n}, not N = {n}")
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise MaskError(f"mask must be a spec such as causal, sliding:1024, "
                        f"document:512,512, prefix:128, blocksparse:0.25:0, got {spec!r}")
    name, _, rest = spec.strip().partition(":")
    name = name.lower()
    if name == "causal" and not rest:
        return causal(n)
    if name == "sliding":
        return sliding(n, rest)
    if name == "document":
        body, _, tail = rest.partition(":")
        if tail and tail.lower() != "causal":
            raise MaskError(f"mask {spec!r}: document:L1,L2,... takes only ':causal' after")
        return document(n, [x.strip() for x in body.split(",")], bool(tail))
    if name == "prefix":
        return prefix(n, rest)
    if name == "padding":
        return padding(n, rest)
    if name == "blocksparse":
        parts = rest.split(":")
        if len(parts) != 2:
            raise MaskError(f"mask {spec!r}: write blocksparse:DENSITY:SEED, e.g. "
                            "blocksparse:0.25:0")
        try:
            density = float(parts[0])
        except ValueError:
            raise MaskError(f"mask {spec!r}: density {parts[0]!r} is not a number") from None
        if not math.isfinite(density):
            raise MaskError(f"block-sparse density must be a fraction in (0, 1], got {density}")
        seed = parts[1].strip()
        if not seed.isdigit():
            raise MaskError(f"mask {spec!r}: seed {parts[1]!r} is not a whole number from 0")
        return blocksparse(n, density, int(seed))
    raise MaskError(f"unknown mask {spec!r}; choose one of causal, sliding:W, "
                    "document:L1,L2,...[:causal], prefix:P, padding:V, blocksparse:DENSITY:SEED")


def documents(n: int, count: int) -> list[int]:
    """``count`` document lengths summing to N, as equal as whole tokens allow."""
    count = _positive(count, "number of documents")
    if count > n:
        raise MaskError(f"{count} documents do not fit in N = {n} tokens")
    base, extra = divmod(n, count)
    return [base + (k < extra) for k in range(count)]


# -- what a mask costs to carry ------------------------------------------------------------
def dense_mask_bytes(n: int) -> int:
    """A dense N x N boolean mask, one byte an element (PyTorch's bool): what a baseline
    reads from HBM (once per head that reads it)."""
    return n * n


def flashmask_bytes(n: int) -> int:
    """FlashMask's four int32 vectors: 16 N bytes."""
    return VECTOR_BYTES * n


def cu_seqlens(lengths) -> np.ndarray:
    """flash-attention's varlen offsets: [0, L1, L1 + L2, ...] (int32)."""
    lengths = [_positive(x, "sequence length") for x in lengths]
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def padding_waste(lengths) -> dict:
    """A batch of sequences padded to the longest against varlen packing (``cu_seqlens``):
    tokens stored, and the attention work in units of N^2 (score elements) each way.

    padded: B max(L) tokens, B max(L)^2 scores; packed: sum L tokens, sum L^2 scores."""
    lengths = [_positive(x, "sequence length") for x in lengths]
    B, top = len(lengths), max(lengths)
    packed_scores = sum(x * x for x in lengths)
    return {"sequences": B, "padded_tokens": B * top, "packed_tokens": sum(lengths),
            "padded_scores": B * top * top, "packed_scores": packed_scores,
            "token_waste": 1 - sum(lengths) / (B * top),
            "score_waste": 1 - packed_scores / (B * top * top),
            "cu_seqlens": cu_seqlens(lengths)}


# -- dropout: random numbers regenerated from (seed, row, column) --------------------------
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def dropout_scale(seed: int, p: float, rows: tuple[int, int], cols: tuple[int, int]
                  ) -> np.ndarray:
    """(r1 - r0, c1 - c0): Z / (1 - p), Z = 1 where element (r, c) is kept. A counter-based
    generator (splitmix64 of seed, row, column), so any tile is regenerated from the seed
    and its offset alone, as FlashAttention's fused dropout does with Philox; every head
    shares the pattern (a kernel offsets it by head, which changes no count)."""
    r = np.arange(*rows, dtype=np.uint64)[:, None]
    c = np.arange(*cols, dtype=np.uint64)[None, :]
    with np.errstate(over="ignore"):
        x = (np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)) ^ (r << np.uint64(32)) ^ c
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    u = (x >> np.uint64(11)).astype(np.float64) / float(2**53)
    return np.where(u >= p, 1.0 / (1.0 - p), 0.0)


# -- what a plan accepts ------------------------------------------------------------------
MASKED_ALGORITHMS = ("standard", "flash2")


def check(algorithm: str, n: int, causal: bool, mask, dropout, seed) -> tuple:
    """(Mask or None, p, seed) for :func:`flashsim.plan`, or one MaskError."""
    from . import validate
    if mask is not None:
        if causal:
            raise MaskError("give causal=True or a mask, not both (mask='causal' is the "
                            "causal mask through FlashMask's vectors)")
        if algorithm not in MASKED_ALGORITHMS:
            raise MaskError(f"masks run on {' and '.join(MASKED_ALGORITHMS)}; {algorithm} "
                            "takes causal=True only")
        mask = parse(mask, n)
    if (isinstance(dropout, bool) or not isinstance(dropout, (int, float, np.floating))
            or not 0 <= dropout < 1):      # NaN fails here too
        raise MaskError(f"dropout must be a probability p with 0 <= p < 1, got {dropout!r}")
    if dropout and algorithm not in MASKED_ALGORITHMS:
        raise MaskError(f"dropout runs on {' and '.join(MASKED_ALGORITHMS)}, not {algorithm}")
    seed = validate.whole(seed, "dropout_seed", lo=0, hi=2**63 - 1)
    return mask, float(dropout), seed


def reference_args(plan) -> dict:
    """``mask=`` and ``dropout=`` for :mod:`flashsim.reference`, from a plan."""
    out = {}
    if getattr(plan, "mask", None) is not None:
        out["mask"] = plan.mask.dense(plan.block_rows, plan.block_cols)
    if getattr(plan, "dropout", 0.0):
        n = plan.seq_len
        out["dropout"] = dropout_scale(plan.dropout_seed, plan.dropout, (0, n), (0, n))
    return out


def tile_counts(plan) -> dict:
    """{skipped, partial, full, tiles, fraction}: the plan's tiles under its mask."""
    t = plan.mask.classify(plan.block_rows, plan.block_cols)
    skipped, partial = int((t == SKIP).sum()), int((t == PARTIAL).sum())
    return {"skipped": skipped, "partial": partial, "full": int(t.size) - skipped - partial,
            "tiles": int(t.size), "fraction": 1 - skipped / t.size}


def cli_fields(plan) -> dict:
    """The JSON fields ``flashsim io`` adds for a mask or dropout (none without)."""
    out = {}
    if plan.mask is not None:
        out["mask"] = plan.mask.spec
        if plan.algorithm in ("flash2",):
            out["mask_tiles"] = tile_counts(plan)
        else:
            out["mask_tiles"] = None      # standard computes every tile
    if plan.dropout:
        out["dropout"] = plan.dropout
        out["dropout_seed"] = plan.dropout_seed
    return out


def cli_lines(plan) -> list[str]:
    """The lines ``flashsim io`` prints under its table for a mask or dropout."""
    out = []
    if plan.mask is not None:
        if plan.algorithm == "flash2":
            c = tile_counts(plan)
            out.append(f"mask {plan.mask.spec}: {c['skipped']:,} of {c['tiles']:,} tiles "
                       f"skipped, {c['partial']:,} partial, {c['full']:,} full "
                       f"(computed fraction {c['fraction']:.4f})")
        else:
            out.append(f"mask {plan.mask.spec}: read as a dense N x N bool "
                       f"({dense_mask_bytes(plan.seq_len):,} B a head); no tile skipped")
    if plan.dropout:
        how = ("a separate pass stores its keep mask Z" if plan.algorithm == "standard"
               else "fused: regenerated from the seed, nothing stored")
        out.append(f"dropout p = {plan.dropout:g} (seed {plan.dropout_seed}): {how}")
    return out
