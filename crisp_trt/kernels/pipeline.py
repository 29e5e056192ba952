"""crisp_cuda: the CUDA path of `crisp::prefill_attention` — estimate → route → select → attend.

Every stage is a Triton kernel over fixed-size buffers sized from max_seqlen (NB = ceil(max/B)
blocks), with per-sequence bounds read on the device from cu_seqlens: no `.item()`, no `nonzero()`,
no host synchronisation, so the op runs under CUDA-graph capture. Launch order (the plugin repeats
it): zero s_mass → estimate_partial → estimate_mass → slash_reduce → pool → route → select → attend.
The input poison (non-finite q/k/v or malformed cu_seqlens → NaN output) is a device-side where.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..config import CrispConfig
from .attend import attend
from .estimate import estimate_mass_kernel, estimate_partial_kernel, slash_reduce_kernel
from .pool import pool_kernel
from .route import route_kernel
from .select import select_kernel

QG = 16  # query blocks per select program (tl.dot needs 16 rows)
SELECT_CHUNK = 64  # key blocks per select tile
SLASH_ROWS = 16  # offset blocks per slash_reduce program


@dataclass
class Plan:
    """What attend consumes, plus the per-head decisions (all device tensors).

    idx [S, H, NB, MAXK] int32 off-diagonal key blocks per query block (unordered, no repeats),
    counts [S, H, NB] int32, dense [S] int32 (1: every causal block; idx unused), route [S, H] int32
    (0 dense, 1 vertical-slash, 2 block-sparse), c_struct [S, H] f32, density [S, H] f32 (fraction of
    causal blocks attended); columns / distances [S, H, NB] int8: the vertical-slash keep maps.
    """

    idx: torch.Tensor
    counts: torch.Tensor
    dense: torch.Tensor
    route: torch.Tensor
    c_struct: torch.Tensor
    density: torch.Tensor
    columns: torch.Tensor
    distances: torch.Tensor


def _pow2(x: int) -> int:
    return max(16, 1 << (max(x, 1) - 1).bit_length())


@dataclass(frozen=True)
class Sizes:
    """Static buffer sizes of one launch (what the plugin's workspace layout also needs)."""

    nb: int
    chunk: int
    nch: int
    maxc: int
    maxd: int
    maxk: int

    @classmethod
    def of(cls, max_seqlen: int, cfg: CrispConfig) -> "Sizes":
        nb = -(-max_seqlen // cfg.block_size)
        chunk = max(4, -(-nb // 64))  # ≤ 64 chunks: each estimate_mass program merges them all
        maxc = min(nb, cfg.sink_blocks + cfg.max_blocks)
        maxd = min(nb, 2 * (cfg.local_blocks + cfg.max_blocks))
        return cls(nb, chunk, -(-nb // chunk), max(maxc, 1), max(maxd, 1), cfg.max_list(nb))


class Stages:
    """The buffers and launches of one plan: estimate() → route() → select(), each a method so the
    stages can be timed apart (scripts/speed_table.py); plan() runs all three."""

    def __init__(self, q, k, cu_seqlens, max_seqlen: int, cfg: CrispConfig):
        self.q, self.k, self.cu, self.cfg = q, k, cu_seqlens, cfg
        self.seqs, (self.heads, self.d), self.kv_heads = cu_seqlens.shape[0] - 1, q.shape[1:], k.shape[1]
        self.z = Sizes.of(max_seqlen, cfg)
        self.scale, self.dense_below = 1.0 / math.sqrt(self.d), max(cfg.dense_below, 1)
        self.knobs = (cfg.kappa, cfg.floor_quantile, cfg.gamma)
        self.floor = cfg.budget == "floor"

    def _empty(self, *shape, dtype=torch.float32):
        return torch.empty(*shape, dtype=dtype, device=self.q.device)

    def estimate(self):
        """Proxy-map statistics vsum, vmax, ssum, smax [S, H, NB] and the pooled q/k blocks."""
        q, k, cu, cfg, z, seqs, heads = self.q, self.k, self.cu, self.cfg, self.z, self.seqs, self.heads
        block, window = cfg.block_size, cfg.window
        part_m, part_l = self._empty(seqs, heads, z.nch, window), self._empty(seqs, heads, z.nch, window)
        self.vsum, self.vmax, self.ssum, self.smax = (self._empty(seqs, heads, z.nb) for _ in range(4))
        s_mass = torch.zeros(seqs, heads, z.nb * block, dtype=torch.float32, device=q.device)
        warps = 4 if block * self.d <= 64 * 128 else 8
        shape = dict(H=heads, G=heads // self.kv_heads, L=window, BLOCK=block, D=self.d)
        args = (self.scale, z.chunk, self.dense_below, q.shape[0])
        estimate_partial_kernel[(z.nch, heads, seqs)](q, k, cu, part_m, part_l, *args, NCH=z.nch, **shape,
                                                       num_warps=warps)
        estimate_mass_kernel[(z.nch, heads, seqs)](q, k, cu, part_m, part_l, self.vsum, self.vmax, s_mass, *args,
                                                    NB=z.nb, NCH=z.nch, W=min(block, 64), **shape,
                                                    num_warps=warps)
        slash_reduce_kernel[(-(-z.nb // SLASH_ROWS), heads, seqs)](s_mass, cu, self.ssum, self.smax, *args[2:],
                                                                   H=heads, NB=z.nb, RB=SLASH_ROWS, BLOCK=block)
        self.pooled_q = self._empty(seqs, z.nb, heads, self.d)
        self.pooled_k = self._empty(seqs, z.nb, self.kv_heads, self.d)
        pool_kernel[(z.nb, heads + self.kv_heads, seqs)](q, k, cu, self.pooled_q, self.pooled_k, *args[2:], H=heads,
                                                          HK=self.kv_heads, NB=z.nb, BLOCK=block, D=self.d)

    def route(self):
        """Per head: kept columns / distances (maps and lists), C_struct, route; dense flag per sequence."""
        cfg, z, seqs, heads, i32 = self.cfg, self.z, self.seqs, self.heads, torch.int32
        self.columns, offsets, self.distances = (torch.zeros(seqs, heads, z.nb, dtype=torch.int8, device=self.q.device)
                                                 for _ in range(3))
        self.cols, self.dists = self._empty(seqs, heads, z.maxc, dtype=i32), self._empty(seqs, heads, z.maxd, dtype=i32)
        self.ncols, self.ndists, self.route_ = (self._empty(seqs, heads, dtype=i32) for _ in range(3))
        self.c_struct, self.dense = self._empty(seqs, heads), self._empty(seqs, dtype=i32)
        route_kernel[(heads, seqs)](
            self.vsum, self.vmax, self.ssum, self.smax, self.cu, self.q, self.pooled_k, self.columns, offsets,
            self.distances, self.cols, self.ncols, self.dists, self.ndists, self.c_struct, self.route_, self.dense,
            self.scale, *self.knobs, cfg.tau, cfg.min_blocks, cfg.max_blocks, self.dense_below, self.q.shape[0],
            H=heads, G=heads // self.kv_heads, NB=z.nb, L=cfg.window, B=cfg.block_size, D=self.d, SINK=cfg.sink_blocks,
            LOCAL=cfg.local_blocks, MAXC=z.maxc, MAXD=z.maxd, FLOOR=self.floor, MIN_TOP=cfg.min_blocks > 0,
            JSD=cfg.routing == "jsd", C=min(1024, _pow2(z.nb)), num_warps=4)

    def select(self):
        """Per (sequence, head, query block): the off-diagonal key-block list and its count."""
        cfg, z, seqs, heads = self.cfg, self.z, self.seqs, self.heads
        self.idx = self._empty(seqs, heads, z.nb, z.maxk, dtype=torch.int32)
        self.counts = torch.zeros(seqs, heads, z.nb, dtype=torch.int32, device=self.q.device)
        scratch = self._empty(seqs * heads * z.nb * z.nb)
        select_kernel[(-(-z.nb // QG), heads, seqs)](
            self.cu, self.route_, self.columns, self.cols, self.ncols, self.dists, self.ndists, self.pooled_q,
            self.pooled_k, scratch, self.idx, self.counts, self.scale, *self.knobs, cfg.min_blocks, cfg.max_blocks,
            self.q.shape[0], H=heads, G=heads // self.kv_heads, NB=z.nb, MAXK=z.maxk, D=self.d, BLOCK=cfg.block_size,
            SINK=cfg.sink_blocks, LOCAL=cfg.local_blocks, MAXC=z.maxc, MAXD=z.maxd, MAXCP=_pow2(z.maxc),
            MAXDP=_pow2(z.maxd), FLOOR=self.floor, MIN_TOP=(not self.floor) and cfg.min_blocks > 0,
            SAMPLES=cfg.floor_samples, QG=QG, C=SELECT_CHUNK, num_warps=4)

    def plan(self) -> Plan:
        self.estimate()
        self.route()
        self.select()
        density = _density(self.counts, self.dense, self.cu, self.cfg.block_size)
        return Plan(self.idx, self.counts, self.dense, self.route_, self.c_struct, density, self.columns,
                    self.distances)


def plan(q: torch.Tensor, k: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, cfg: CrispConfig) -> Plan:
    """estimate → route → select for packed q [total, H, d], k [total, H_kv, d] (cu_seqlens int32 [S + 1])."""
    return Stages(q, k, cu_seqlens, max_seqlen, cfg).plan()


def _density(counts, dense, cu_seqlens, block):
    """Fraction of causal blocks attended per (seq, head): (Σ listed + diagonals) / (nb (nb + 1) / 2)."""
    nb = ((cu_seqlens[1:] - cu_seqlens[:-1] + block - 1) // block).float()[:, None]
    causal = (nb * (nb + 1) / 2).clamp_min(1)
    sparse = (counts.sum(-1).float() + nb) / causal
    return torch.where(dense[:, None].bool(), (nb > 0).float(), sparse)


def routing_only(q: torch.Tensor, k: torch.Tensor, cfg: CrispConfig) -> Plan:
    """plan() for one sequence given as [1, n, H, d] or [n, H, d] (bench: routing+select time)."""
    q, k = (t.reshape(-1, *t.shape[-2:]) for t in (q, k))
    cu = torch.tensor([0, q.shape[0]], dtype=torch.int32, device=q.device)
    return plan(q.contiguous(), k.contiguous(), cu, q.shape[0], cfg)


def lists_from_masks(masks: list[torch.Tensor], nqb: int, maxk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Block masks (per sequence, bool [H, nb, nb], diagonal included) → attend's off-diagonal lists:
    idx [S, H, nqb, maxk] int32 (ascending key blocks, padding 0) and counts [S, H, nqb] int32."""
    heads = masks[0].shape[0]
    idx = torch.zeros(len(masks), heads, nqb, maxk, dtype=torch.int32)
    counts = torch.zeros(len(masks), heads, nqb, dtype=torch.int32)
    for s, m in enumerate(masks):
        nb = m.shape[-1]
        off = m.tril(-1)
        order = torch.sort((~off).int(), dim=-1, stable=True).indices[..., :maxk]
        kept = torch.gather(off, -1, order)
        idx[s, :, :nb, : order.shape[-1]] = torch.where(kept, order, 0).int()
        counts[s, :, :nb] = off.sum(-1).clamp_max(maxk).int()
    return idx, counts


def masks_from_plan(p, s: int, nb: int, qb: torch.Tensor | None = None) -> torch.Tensor:
    """Attended key blocks bool [H, len(qb), nb] of query blocks qb (default: all nb) of sequence s, diagonal
    included (every causal block when dense[s]), on the plan's device — for tests and recall. Any object
    with Plan's idx / counts / dense fields works."""
    dev = p.idx.device
    qb = torch.arange(nb, device=dev) if qb is None else qb.to(dev)
    idx = p.idx[s][:, qb].long()
    valid = torch.arange(idx.shape[-1], device=dev) < p.counts[s].to(dev)[:, qb, None]
    allowed = torch.zeros(*idx.shape[:2], nb + 1, dtype=torch.bool, device=dev)
    allowed.scatter_(-1, torch.where(valid, idx, nb), True)  # unused slots → a spare column
    kb = torch.arange(nb, device=dev)
    always = torch.where(p.dense[s].to(dev).bool(), kb <= qb[:, None], kb == qb[:, None])
    return allowed[..., :nb] | always[None]


def input_poison(q, k, v, cu_seqlens) -> torch.Tensor:
    """Device bool scalar: True iff any q/k/v entry is non-finite or cu_seqlens is malformed."""
    bad = ~(torch.isfinite(q).all() & torch.isfinite(k).all() & torch.isfinite(v).all())
    steps = cu_seqlens[1:] - cu_seqlens[:-1]
    malformed = (cu_seqlens[0] != 0) | (cu_seqlens[-1] != q.shape[0]) | (steps < 0).any()
    return bad | malformed


def crisp_cuda(q, k, v, cu_seqlens, max_seqlen: int, cfg: CrispConfig):
    """(out [total, H, d], route int32 [S, H], c_struct f32 [S, H], density f32 [S, H])."""
    p = plan(q, k, cu_seqlens, max_seqlen, cfg)
    out = attend(q, k, v, cu_seqlens, p.idx, p.counts, p.dense, cfg.block_size)
    out = torch.where(input_poison(q, k, v, cu_seqlens), float("nan"), out)
    return out, p.route, p.c_struct, p.density
