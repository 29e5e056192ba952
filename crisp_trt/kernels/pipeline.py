"""crisp_cuda: the CUDA path of `crisp::prefill_attention` — estimate → route → select → attend.

Every stage is a Triton kernel over fixed-size buffers sized from max_seqlen (NB = ceil(max/B)
blocks; launch.Sizes / launch.buffers), with per-sequence bounds read on the device from cu_seqlens:
no `.item()`, no `nonzero()`, no host synchronisation, so the op runs under CUDA-graph capture. Launch
order and conditions (contract.LAUNCHES, which the TensorRT plugin is generated from): zero s_mass, keep maps,
counts, poison flag → (estimate_partial → estimate_mass → slash_reduce →) (pool →) route (→ route_jsd) →
(spike →) (rows →) select → attend → poison_scan → poison_apply (non-finite q/k/v or malformed cu_seqlens → NaN
output).
With tau > 1 every head is block-sparse and the vertical-slash estimate (and JSD routing) does not run
(CrispConfig.estimated); pool runs only where its blocks are read (pooled selection, spikes, JSD routing).
Chunked prefill: cu_seqlens_k gives each sequence's keys, cu_seqlens its queries (the last q_len ≤ kv_len
positions); max_seqlen then bounds the kv lengths, and query blocks are absolute (reference.py).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from ..config import CrispConfig
from .attend import attend
from .estimate import estimate_mass_kernel, estimate_partial_kernel, slash_reduce_kernel
from .launch import grids, run, workspace
from .poison import poison
from .pool import pool_kernel
from .route import route_jsd_kernel, route_kernel
from .rows import rows_kernel
from .select import select_kernel
from .spike import spike_kernel


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


class Stages:
    """The buffers and launches of one plan: estimate() → route() → select(), each a method so the
    stages can be timed apart; plan() runs all three. The buffers are views of one
    workspace (launch.Workspace, the plugin's layout) whose zeroed prefix estimate() clears with one memset,
    as it starts a plan: one allocation and one fill instead of ~25 of each per call (host time at short
    lengths)."""

    def __init__(self, q, k, cu_seqlens, max_seqlen: int, cfg: CrispConfig, cu_seqlens_k=None):
        self.q, self.k, self.cu, self.cfg = q, k, cu_seqlens, cfg
        self.cu_k = cu_seqlens if cu_seqlens_k is None else cu_seqlens_k  # whole prompts: the same table
        self.bounds = (self.cu, self.cu_k)
        self.seqs, (self.heads, self.d), self.kv_heads = cu_seqlens.shape[0] - 1, q.shape[1:], k.shape[1]
        self.z, self.ws = workspace(self.seqs, self.heads, self.kv_heads, self.d, cfg, max_seqlen)
        self.memory = torch.empty(self.ws.size, dtype=torch.uint8, device=q.device)
        self._typed: dict = {}
        self.scale, self.dense_below = 1.0 / math.sqrt(self.d), max(cfg.dense_below, 1)
        self.knobs = (cfg.kappa, cfg.floor_quantile, cfg.gamma)
        self.budget_flags = dict(FLOOR=cfg.budget == "floor", MIN_TOP=cfg.min_blocks > 0)  # route and select
        self.groups, self.total, self.total_k = self.heads // self.kv_heads, q.shape[0], k.shape[0]
        self.grids = grids(self.seqs, self.heads, self.kv_heads, self.d, cfg, max_seqlen, self.total, self.total_k)

    def _buffer(self, name: str) -> torch.Tensor:
        """A buffer of the layout: one as_strided of the workspace, typed once per dtype (one aten op, not four)."""
        offset, shape, dtype = self.ws.layout[name]
        element = self.q.dtype if dtype == "input" else getattr(torch, dtype)  # input: q's dtype, at most ITEMSIZE
        typed = self._typed.get(element)
        if typed is None:
            typed = self._typed[element] = self.memory.view(element)  # offsets and size are ALIGN multiples
        return typed.as_strided(shape, _contiguous_strides(shape), offset // element.itemsize)

    def estimate(self):
        """Proxy-map statistics vsum, vmax, ssum, smax [S, H, NB] and the pooled q/k blocks."""
        q, k, cfg, z, heads = self.q, self.k, self.cfg, self.z, self.heads
        block, d, g = cfg.block_size, self.d, self.groups
        self.memory[:self.ws.zeroed].zero_()  # s_mass, the keep maps, counts, the poison flag
        part_m, part_l, s_mass = (self._buffer(n) for n in ("part_m", "part_l", "s_mass"))
        self.vsum, self.vmax, self.ssum, self.smax = (self._buffer(n) for n in ("vsum", "vmax", "ssum", "smax"))
        self.pooled_q, self.pooled_k, self.pooled_k_in = map(self._buffer, ("pooled_q", "pooled_k", "pooled_k_in"))
        args = (self.scale, z.chunk, self.dense_below, self.total, self.total_k)
        tile = dict(L=cfg.window, BLOCK=block, D=d)
        if self.grids["estimate_partial"]:  # the vertical-slash estimate
            run(estimate_partial_kernel, self.grids["estimate_partial"], q, k, *self.bounds, part_m, part_l, *args,
                heads, g, z.nch, block=block, d=d, **tile)
        if self.grids["estimate_mass"]:
            run(estimate_mass_kernel, self.grids["estimate_mass"], q, k, *self.bounds, part_m, part_l, self.vsum,
                self.vmax, s_mass, *args, heads, g, z.nb, z.nch, block=block, d=d, **tile)
        if self.grids["slash_reduce"]:
            run(slash_reduce_kernel, self.grids["slash_reduce"], s_mass, *self.bounds, self.ssum,
                self.smax, self.dense_below, self.total, self.total_k, heads, z.nb, block=block, BLOCK=block)
        if self.grids["pool"]:
            run(pool_kernel, self.grids["pool"], q, k, *self.bounds, self.pooled_q, self.pooled_k,
                self.pooled_k_in, self.dense_below, self.total, self.total_k, heads, self.kv_heads, z.nb, block=block,
                d=d, BLOCK=block, D=d)

    def route(self):
        """Per head: kept columns / distances (maps and lists), C_struct, route; dense flag per sequence."""
        cfg, z, heads = self.cfg, self.z, self.heads
        self.columns, offsets, self.distances = (self._buffer(n) for n in ("columns", "offsets", "distances"))
        self.cols, self.dists, self.ncols, self.ndists = (self._buffer(n) for n in ("cols", "dists", "ncols", "ndists"))
        self.route_, self.c_struct, self.dense = (self._buffer(n) for n in ("route", "c_struct", "dense"))
        run(route_kernel, self.grids["route"], self.vsum, self.vmax, self.ssum, self.smax, *self.bounds, self.columns,
            offsets, self.distances, self.cols, self.ncols, self.dists, self.ndists, self.c_struct, self.route_,
            self.dense, *self.knobs, cfg.tau, cfg.coverage, len(cfg.kappas()), cfg.min_blocks, cfg.max_blocks,
            self.dense_below, self.total, self.total_k, heads, z.nb, cfg.block_size, cfg.sink_blocks,
            cfg.local_blocks, z.maxc, z.maxd, block=cfg.block_size, C=z.route_chunk, **self.budget_flags)
        if self.grids["route_jsd"]:
            run(route_jsd_kernel, self.grids["route_jsd"], self.vsum, *self.bounds, self.q, self.pooled_k, self.route_,
                self.scale, cfg.tau, self.dense_below, self.total, self.total_k, heads, self.groups, z.nb,
                cfg.block_size, block=cfg.block_size, d=self.d, L=cfg.window, D=self.d)

    def select(self):
        """Per (sequence, head, query block): the off-diagonal key-block list and its count."""
        self.scores()
        self.lists()

    def scores(self):
        """What select ranks block-sparse rows by, besides pooled attention: spike flags, sampled rows' mass."""
        cfg, z, seqs, heads = self.cfg, self.z, self.seqs, self.heads
        scratch, spikes, slots = map(self._buffer, ("scratch", "spikes", "slots"))
        if self.grids["spike"]:
            run(spike_kernel, self.grids["spike"], self.q, *self.bounds, self.pooled_k_in, spikes, self.scale,
                cfg.spike, self.dense_below, self.total, self.total_k, heads, self.groups, z.nb, block=cfg.block_size,
                d=self.d, BLOCK=cfg.block_size, D=self.d)
        if self.grids["rows"]:
            run(rows_kernel, self.grids["rows"], self.q, self.k, *self.bounds, self.route_, scratch,
                slots, self.scale, self.dense_below, self.total, self.total_k, seqs, heads, self.groups, z.nb,
                block=cfg.block_size, d=self.d, BLOCK=cfg.block_size, D=self.d, R=cfg.rows)

    def lists(self):
        """The select kernel alone (after scores)."""
        cfg, z, heads = self.cfg, self.z, self.heads
        self.idx, self.counts, scratch, spikes = map(self._buffer, ("idx", "counts", "scratch", "spikes"))
        run(select_kernel, self.grids["select"], *self.bounds, self.route_, self.columns,
            self.distances, self.cols, self.ncols, self.dists, self.ndists, self.pooled_q, self.pooled_k, scratch,
            spikes, self.idx, self.counts, self.scale, *self.knobs, cfg.spike, cfg.min_blocks, cfg.max_blocks,
            self.total, self.total_k, heads, self.groups, z.nb, z.maxk, cfg.block_size, cfg.sink_blocks,
            cfg.local_blocks, z.maxc, z.maxd, cfg.floor_samples,
            block=cfg.block_size, d=self.d, D=self.d, ROWS=cfg.rows > 0, **self.budget_flags)

    def plan(self, density: bool = True) -> Plan:
        """The three stages; density=False leaves Plan.density None (its small kernels skipped)."""
        self.estimate()
        self.route()
        self.select()
        density = _density(self.counts, self.dense, self.cu, self.cu_k, self.cfg.block_size) if density else None
        return Plan(self.idx, self.counts, self.dense, self.route_, self.c_struct, density, self.columns,
                    self.distances)

    def attend(self, v, lse: torch.Tensor | None = None) -> torch.Tensor:
        """attend over the planned lists (writing the LSE into lse [total_q, H] f32 when given), then the input
        poison (NaN output and LSE for bad inputs)."""
        out = attend(self.q, self.k, v, self.cu, self.idx, self.counts, self.dense, self.cfg.block_size,
                     cu_seqlens_k=self.cu_k, lse=lse, descriptors=self._buffer("descriptors").view(-1))
        return poison(self.q, self.k, v, self.cu, self.cu_k, out, lse, self._buffer("poison"))


@functools.lru_cache(maxsize=1024)
def _contiguous_strides(shape: tuple) -> tuple:
    return tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))


def plan(q: torch.Tensor, k: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, cfg: CrispConfig,
         cu_seqlens_k: torch.Tensor | None = None) -> Plan:
    """estimate → route → select for packed q [total_q, H, d], k [total_k, H_kv, d] (cu_seqlens int32 [S + 1];
    chunks: cu_seqlens_k, max_seqlen bounding the kv lengths)."""
    return Stages(q, k, cu_seqlens, max_seqlen, cfg, cu_seqlens_k).plan()


def _density(counts, dense, cu_seqlens, cu_seqlens_k, block):
    """Fraction of causal blocks attended per (seq, head) over the query blocks the chunk touches (first…nb−1):
    (Σ listed + diagonals) / Σ (qb + 1); a sequence with no queries has none (chunk_bounds)."""
    q_len = (cu_seqlens[1:] - cu_seqlens[:-1])[:, None]
    kv_len = torch.where(q_len > 0, (cu_seqlens_k[1:] - cu_seqlens_k[:-1])[:, None], 0)
    nb, first = (kv_len + block - 1) // block, (kv_len - q_len).clamp_min(0) // block
    causal = ((nb * (nb + 1) - first * (first + 1)) / 2).clamp_min(1)
    sparse = (counts.sum(-1).float() + (nb - first)) / causal
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


def crisp_cuda(q, k, v, cu_seqlens, max_seqlen: int, cfg: CrispConfig, cu_seqlens_k=None, return_lse: bool = False,
               return_stats: bool = True):
    """(out [total_q, H, d], lse f32 [total_q, H] (or [0] without return_lse), route int32 [S, H], c_struct f32
    [S, H], density f32 [S, H] (each [0] without return_stats)); chunks: cu_seqlens_k for k, v [total_k, H_kv, d],
    max_seqlen bounding kv lengths."""
    st = Stages(q, k, cu_seqlens, max_seqlen, cfg, cu_seqlens_k)
    p = st.plan(density=return_stats)
    lse = torch.empty((q.shape[0], q.shape[1]) if return_lse else (0,), dtype=torch.float32, device=q.device)
    out = st.attend(v, lse if return_lse else None)
    if not return_stats:
        return out, lse, *(torch.empty(0, dtype=t, device=q.device) for t in (torch.int32, torch.float32, torch.float32))
    # route and c_struct are views of the workspace: a custom op's outputs may not share storage
    return out, lse, p.route.clone(), p.c_struct.clone(), p.density
