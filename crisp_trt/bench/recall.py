"""Attention-mass recall of a Plan on sampled query rows (docs/design.md, "Measuring"), computed where q lives.

For a sampled row r of one sequence and a head h, the exact causal softmax row p = softmax(q_r·Kᵀ/√d)
(fp32) is summed over the key blocks the attend kernel visits for r's query block qb = r // B: the
listed blocks idx[s, h, qb, :counts[s, h, qb]] plus the diagonal block qb, or every causal block when
dense[s]. recall = mean over heads and rows (1.0 = nothing of the dense mass is dropped). Anything with
the Plan contract's idx / counts / dense fields works: `crisp_trt.kernels.pipeline.plan` on the GPU, the
reference masks converted by `plan_from_masks` on the CPU. Rows are the last rows//2 (where retrieval
queries sit) and rows//2 uniform ones, so the cost is O(rows · n) per head at any length.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from ..kernels.pipeline import lists_from_masks, masks_from_plan
from ..reference import dense_rows


def sample_rows(n: int, rows: int = 64, seed: int = 0) -> torch.Tensor:
    """Sorted unique token positions: the last rows//2 and rows//2 uniform ones (fixed seed)."""
    g = torch.Generator().manual_seed(seed)
    last = torch.arange(max(n - rows // 2, 0), n)
    return torch.unique(torch.cat([last, torch.randint(0, n, (rows // 2,), generator=g)]))


def plan_from_masks(masks: list[torch.Tensor]):
    """Per-sequence block masks bool [H, nb, nb] (diagonal included) → a Plan-like (idx, counts, dense)."""
    nb = max(m.shape[-1] for m in masks)
    idx, counts = lists_from_masks(masks, nb, nb)
    return SimpleNamespace(idx=idx, counts=counts, dense=torch.zeros(len(masks), dtype=torch.int32))


def block_mass(q: torch.Tensor, k: torch.Tensor, block: int, rows: int = 64, seed: int = 0):
    """The sampled rows r (sample_rows) and, per head, their dense softmax mass per key block [H, R, NB];
    q [n, H, d], k [n, H_kv, d]. Recall of any block selection is (mass * allowed).sum(-1).mean(): the one
    measure behind crisp-bench's recall and calibration's."""
    n, heads, _ = q.shape
    group = heads // k.shape[1]
    r = sample_rows(n, rows, seed).to(q.device)
    future = torch.arange(n, device=q.device)[None] > r[:, None]
    return r, torch.stack([dense_rows(q[r, h], k[:, h // group], future, block)[1] for h in range(heads)])


def plan_recall(q: torch.Tensor, k: torch.Tensor, plan, block: int, *, seq: int = 0, rows: int = 64,
                seed: int = 0) -> float:
    """Mean dense softmax mass inside the plan's attended blocks; q [n, H, d], k [n, H_kv, d] of `seq`."""
    r, mass = block_mass(q, k, block, rows, seed)
    allowed = masks_from_plan(plan, seq, mass.shape[-1], r // block).to(q.device)        # [H, R, nkb]
    return float((mass * allowed).sum(-1).mean())


def oracle_positions(n: int, block: int, rows: int, where: str) -> torch.Tensor:
    """Query rows the oracle scores: "last" = the last `rows` rows; "spread" = rows // block whole query
    blocks evenly spaced over the sequence (every block when that many or more), so their summed squared
    error estimates the full sequence's — the last rows alone overrate recent key blocks."""
    if where == "last":
        return torch.arange(max(0, n - rows), n)
    if where != "spread":
        raise ValueError(f"where={where!r}: expected 'last' or 'spread'")
    nb = -(-n // block)
    count = max(1, min(nb, rows // block))
    chosen = ((torch.arange(count) * 2 + 1) * nb) // (2 * count)
    return (chosen[:, None] * block + torch.arange(block)).flatten().clamp_max(n - 1).unique()


def same_budget_oracle(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan, block: int, *, seq: int = 0,
                       rows: int = 1024, where: str = "last") -> dict:
    """How good any block selection could be with the plan's budget, on `rows` query rows (oracle_positions).

    Per head and query block, the oracle keeps the key blocks with the most dense softmax mass (summed over
    the block's scored rows), as many as the plan attends there (diagonal included, so a full causal
    row is dense). Both are scored the same way — output rel. error vs dense and kept mass on those rows,
    fp32 — so the gap says how much is the selection's fault and how much the workload's: when the oracle
    misses an error target at the plan's density, no block selection of that size meets it."""
    n, heads, _ = q.shape
    group = heads // k.shape[1]
    r = oracle_positions(n, block, rows, where).to(q.device)
    pos = torch.arange(n, device=q.device)
    qb = r // block
    nkb = -(-n // block)
    blocks, inverse = torch.unique(qb, return_inverse=True)
    planned = masks_from_plan(plan, seq, nkb, blocks).to(q.device)            # [H, QB, nkb]
    future = pos[None] > r[:, None]
    sq = {"plan_err": 0.0, "oracle_err": 0.0, "dense_norm": 0.0, "plan_mass": 0.0, "oracle_mass": 0.0}
    for h in range(heads):
        vv = v[:, h // group].float()
        p, mass = dense_rows(q[r, h], k[:, h // group], future, block)
        per_block = torch.zeros(len(blocks), nkb, device=q.device).index_add_(0, inverse, mass)
        count = planned[h].sum(-1)
        rank = per_block.argsort(-1, descending=True).argsort(-1)
        oracle = rank < count[:, None]
        dense = p @ vv
        sq["dense_norm"] += float(dense.square().sum())
        for name, keep in (("plan", planned[h]), ("oracle", oracle)):
            kept = p * keep[inverse].repeat_interleave(block, -1)[:, :n]
            kept_mass = kept.sum(-1, keepdim=True)
            sq[f"{name}_err"] += float(((kept / kept_mass) @ vv - dense).square().sum())
            sq[f"{name}_mass"] += float(kept_mass.mean()) / heads
    return {"rows": len(r), "plan_rel_err": (sq["plan_err"] / sq["dense_norm"]) ** 0.5,
            "oracle_rel_err": (sq["oracle_err"] / sq["dense_norm"]) ** 0.5,
            "plan_mass": sq["plan_mass"], "oracle_mass": sq["oracle_mass"]}
