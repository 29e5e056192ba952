"""Attention-mass recall of a Plan on sampled query rows (DESIGN.md §6), computed where q lives.

For a sampled row r of one sequence and a head h, the exact causal softmax row p = softmax(q_r·Kᵀ/√d)
(fp32) is summed over the key blocks the attend kernel visits for r's query block qb = r // B: the
listed blocks idx[s, h, qb, :counts[s, h, qb]] plus the diagonal block qb, or every causal block when
dense[s]. recall = mean over heads and rows (1.0 = nothing of the dense mass is dropped). Anything with
the Plan contract's idx / counts / dense fields works: `crisp_trt.kernels.pipeline.plan` on the GPU, the
reference masks converted by `plan_from_masks` on the CPU. Rows are the last rows//2 (where retrieval
queries sit) and rows//2 uniform ones, so the cost is O(rows · n) per head at any length.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from ..kernels.pipeline import lists_from_masks, masks_from_plan


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


def plan_recall(q: torch.Tensor, k: torch.Tensor, plan, block: int, *, seq: int = 0, rows: int = 64,
                seed: int = 0) -> float:
    """Mean dense softmax mass inside the plan's attended blocks; q [n, H, d], k [n, H_kv, d] of `seq`."""
    n, heads, d = q.shape
    group = heads // k.shape[1]
    r = sample_rows(n, rows, seed).to(q.device)
    nkb = -(-n // block)
    allowed = masks_from_plan(plan, seq, nkb, r // block).to(q.device)        # [H, R, nkb]
    future = torch.arange(n, device=q.device)[None] > r[:, None]
    total = 0.0
    for kvh in range(k.shape[1]):
        kk = k[:, kvh].float()
        for h in range(kvh * group, (kvh + 1) * group):
            logits = (q[r, h].float() @ kk.T) / math.sqrt(d)
            p = torch.softmax(logits.masked_fill(future, float("-inf")), -1)
            mass = torch.nn.functional.pad(p, (0, nkb * block - n)).view(len(r), nkb, block).sum(-1)
            total += float((mass * allowed[h]).sum(-1).mean())
    return total / heads
