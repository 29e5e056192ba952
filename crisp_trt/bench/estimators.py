"""Cheap estimates of a query block's attention mass per key block, and the coverage rule that selects from them.

Per head and query block, a coverage selection keeps the diagonal block and then the key blocks with the most
estimated mass until they hold c of the estimate. With the exact mass it is the block oracle (bench.oracle);
with an estimate a kernel could afford, it says how close that selector gets to the oracle, at the model's
accuracy bar, before any kernel is written:
  exact       the dense softmax mass summed over the block's rows (the oracle);
  rowsS       the exact mass of S strided rows of each query block (the last of every B/S, as CrispConfig.rows
              samples them: reference.sampled_rows): S/B of the logits;
  antidiagS   XAttention's antidiagonal scoring (arXiv 2503.16428): every S consecutive queries against every S
              consecutive keys, q_{gS+s} · k_{jS+S-1-s} summed over s, / (sqrt(d) · S), softmax over the causal
              key groups, summed per block: 1/S of the logits' FLOPs and 1/S² of their exponentials.
"""
from __future__ import annotations

import math
import re

import torch

from ..reference import sampled_rows

def parse(estimate: str, block: int) -> tuple[str, int]:
    """(kind, S) of an estimate name; a clear error for anything else."""
    m = re.fullmatch(r"(exact)|(rows|antidiag)(\d+)", estimate)
    stride = int(m.group(3)) if m and m.group(3) else 0
    if m is None or (m.group(2) and not (0 < stride <= block and block % stride == 0)):
        raise ValueError(f"estimate={estimate!r}: expected 'exact', 'rowsS' or 'antidiagS' with S dividing the block "
                         f"({block})")
    return (m.group(1) or m.group(2)), stride


def per_query_block(x: torch.Tensor, qb: torch.Tensor, blocks: int) -> torch.Tensor:
    """Sum x [..., R, NB] over rows into their query blocks qb [R] (0-based in the step): [..., blocks, NB]."""
    return torch.zeros(*x.shape[:-2], blocks, x.shape[-1], device=x.device).index_add_(-2, qb, x)


def antidiagonal_mass(q: torch.Tensor, k: torch.Tensor, first: int, block: int, stride: int) -> torch.Tensor:
    """[..., QB, NB]: the antidiagonal estimate for the query blocks of q [..., R, d] (rows at positions first …,
    first a multiple of the block) against k [..., n, d] (keys 0 … n − 1, n ≥ first + R). A partial last group
    is padded with zero queries, which only drop their terms from its antidiagonal sums."""
    rows, d = q.shape[-2:]
    n = k.shape[-2]
    if first % block:
        raise ValueError(f"first={first}: expected a multiple of block={block}")
    qg, kg = -(-rows // stride), -(-n // stride)
    qq = torch.nn.functional.pad(q.float(), (0, 0, 0, qg * stride - rows)).reshape(*q.shape[:-2], qg, stride * d)
    kk = torch.nn.functional.pad(k.float(), (0, 0, 0, kg * stride - n))
    kk = kk.reshape(*k.shape[:-2], kg, stride, d).flip(-2).reshape(*k.shape[:-2], kg, stride * d)
    g = first // stride + torch.arange(qg, device=q.device)
    logits = (qq @ kk.transpose(-1, -2)) / (math.sqrt(d) * stride)
    p = torch.softmax(logits.masked_fill(torch.arange(kg, device=q.device)[None] > g[:, None], float("-inf")), -1)
    per, nb = block // stride, -(-n // block)
    p = torch.nn.functional.pad(p, (0, nb * per - kg)).reshape(*p.shape[:-1], nb, per).sum(-1)
    return per_query_block(p, (g * stride - first) // block, -(-rows // block))


def estimated_mass(estimate: str, q: torch.Tensor, k: torch.Tensor, first: int, block: int,
                   mass: torch.Tensor) -> torch.Tensor:
    """[..., QB, NB] mass per query block of q's rows (positions first …) by `estimate`; mass [..., R, NB] is the
    exact per-row block mass of those rows (reference.dense_rows), which exact and rowsS read."""
    kind, stride = parse(estimate, block)
    pos = first + torch.arange(q.shape[-2], device=q.device)
    qb, blocks = pos // block - first // block, -(-q.shape[-2] // block)
    if kind == "exact":
        return per_query_block(mass, qb, blocks)
    if kind == "rows":  # reference.sampled_rows: CrispConfig.rows' rows
        picked = sampled_rows(first // block + torch.arange(blocks, device=q.device), block, stride, first,
                              first + q.shape[-2]) - first
        return per_query_block(mass[..., picked.flatten(), :], qb[picked.flatten()], blocks)
    return antidiagonal_mass(q, k, first, block, stride)


def _diagonal_first(est: torch.Tensor, qb: int | torch.Tensor):
    """(order, diagonal, future) of est [..., QB, NB] for query blocks qb [QB] (an int: qb, qb + 1, …): key blocks
    by descending est, the diagonal first and future blocks last."""
    nq, nkb = est.shape[-2:]
    if isinstance(qb, int):
        qb = torch.arange(qb, qb + nq, device=est.device)
    kb = torch.arange(nkb, device=est.device)
    diagonal, future = kb[None] == qb[:, None], kb[None] > qb[:, None]
    return est.masked_fill(future, -1.0).masked_fill(diagonal, float("inf")).argsort(-1, descending=True), diagonal, future


def _unrank(keep_ranked: torch.Tensor, order: torch.Tensor, diagonal: torch.Tensor, future: torch.Tensor):
    return (torch.zeros_like(keep_ranked).scatter_(-1, order, keep_ranked) & ~future) | diagonal


def coverage_keep(est: torch.Tensor, qb: int | torch.Tensor, coverage: float) -> torch.Tensor:
    """bool [..., QB, NB]: per query block qb[i] (an int: qb + i), the diagonal block, then the causal key blocks by descending
    est until the kept ones hold `coverage` of the row's estimate (1.0: every causal block)."""
    order, diagonal, future = _diagonal_first(est, qb)
    if coverage >= 1.0:  # whatever the rounding of the cumulative sum
        return ~future.expand_as(est).clone()
    est = est.masked_fill(future, 0.0)
    ranked = est.gather(-1, order)
    return _unrank(ranked.cumsum(-1) - ranked < coverage * est.sum(-1, keepdim=True), order, diagonal, future)


def count_keep(mass: torch.Tensor, qb0: int, counts: torch.Tensor) -> torch.Tensor:
    """bool [..., QB, NB]: per query block qb0 + i, the diagonal and then the counts[..., i] − 1 heaviest causal
    blocks."""
    order, diagonal, future = _diagonal_first(mass, qb0)
    return _unrank(torch.arange(mass.shape[-1], device=mass.device) < counts[..., None], order, diagonal, future)
