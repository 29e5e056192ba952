"""The block oracle inside a whole model: how sparse could any block selection be at the model's accuracy bar?

Per head and query block, the oracle keeps the key blocks holding the most dense softmax mass (summed over the
block's rows), the diagonal block first, and attends exactly over them, fp32. Two budgets: `coverage` c keeps
blocks until they hold c of the mass (1.0: every causal block, the fp32 control); `budget` cfg keeps as many
blocks as CRISP's plan under cfg lists there on the same activations (bench.recall's same-budget oracle ranks
without putting the diagonal first; it scores sampled rows of one layer, this every row of every layer).
`model_sweep` scores the model as bench.defaults does (perplexity, KL to dense on the last positions): if even
the oracle moves the answers at a density, no block selection at that density keeps them. No kernel: a bound.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..config import CrispConfig
from ..reference import num_blocks
from .estimators import count_keep, coverage_keep, estimated_mass, parse, per_query_block
from ..reference import dense_rows
from ..workloads.texts import CALIBRATION

NAME = "block_oracle"
ACTIVE: dict = {"oracle": None, "kept": 0, "causal": 0}  # the oracle in use and its blocks since the last switch


@dataclass(frozen=True)
class BlockOracle:
    """One oracle budget: coverage in (0, 1], or budget = the CrispConfig whose plan sets the block counts."""
    coverage: float | None = None
    budget: CrispConfig | None = None
    block: int = 128
    estimate: str = "exact"  # bench.estimators: what the coverage ranks and counts (exact: the oracle itself)

    def __post_init__(self):
        if (self.coverage is None) == (self.budget is None):
            raise ValueError("BlockOracle: give exactly one of coverage (a fraction in (0, 1]) or budget (a CrispConfig)")
        if self.coverage is not None and not 0.0 < self.coverage <= 1.0:
            raise ValueError(f"BlockOracle: coverage={self.coverage}, expected a fraction in (0, 1]")
        if self.budget is not None and self.budget.block_size != self.block:
            raise ValueError(f"BlockOracle: budget.block_size={self.budget.block_size}, expected block={self.block}")
        parse(self.estimate, self.block)
        if self.budget is not None and self.estimate != "exact":
            raise ValueError(f"BlockOracle: estimate={self.estimate!r} with a budget; expected 'exact' (an estimate "
                             "ranks only under coverage)")

    def fields(self) -> dict:
        return {"coverage": self.coverage, "budget": None if self.budget is None else self.budget.to_dict(),
                "estimate": self.estimate}


def _budget_counts(q: torch.Tensor, k: torch.Tensor, cfg: CrispConfig) -> torch.Tensor:
    """Blocks CRISP attends per head and query block (diagonal included) under cfg: int [H, nb]; q [n, H, d]."""
    from ..kernels.pipeline import masks_from_plan
    from .op import method_plan

    n = q.shape[0]
    p = method_plan(q.contiguous()[None], k.contiguous()[None], cfg, max_n=n)  # the kernels index [n, H, d] densely
    return masks_from_plan(p, 0, num_blocks(n, cfg.block_size)).sum(-1).to(q.device)


def oracle_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, oracle: BlockOracle,
                     rows_per_step: int | None = None) -> tuple[torch.Tensor, int, int]:
    """(out [n, H, d] in q's dtype, kept blocks, causal blocks) of causal attention of one sequence (q [n, H, d],
    k, v [n, H_kv, d], GQA by repetition) over the oracle's blocks; rows_per_step query rows at a time, whole query
    blocks (default: 2^30 logits a step; two or three such f32 tensors live at once, ≈ 10 GiB)."""
    n, heads, d = q.shape
    block = oracle.block
    rows_per_step = rows_per_step or (1 << 30) // (heads * n)
    group = heads // k.shape[1]
    nb = num_blocks(n, block)
    counts = _budget_counts(q, k, oracle.budget) if oracle.budget is not None else None
    kk = k.float().repeat_interleave(group, 1).transpose(0, 1).contiguous()  # [H, n, d]
    vv = v.float().repeat_interleave(group, 1).transpose(0, 1).contiguous()
    out = torch.empty(n, heads, d, dtype=q.dtype, device=q.device)
    step = max(block, rows_per_step // block * block)
    kept = torch.zeros((), dtype=torch.int64, device=q.device)  # summed on the device: one sync at the end
    for a in range(0, n, step):
        b = min(a + step, n)
        nkb, qb0 = num_blocks(b, block), a // block
        pos = torch.arange(b, device=q.device)
        p, mass = dense_rows(q[a:b].transpose(0, 1), kk[:, :b], pos[None] > pos[a:b, None], block)  # [H, R, b]
        row_qb = pos[a:b] // block - qb0
        if counts is None:
            est = estimated_mass(oracle.estimate, q[a:b].transpose(0, 1), kk[:, :b], a, block, mass)
            keep = coverage_keep(est, qb0, oracle.coverage)  # [H, QB, nkb]
        else:
            keep = count_keep(per_query_block(mass, row_qb, nkb - qb0), qb0, counts[:, qb0:nkb])
        kept += keep.sum()
        p = p * keep[:, row_qb].repeat_interleave(block, -1)[..., :b]
        out[a:b] = ((p @ vv[:, :b]) / p.sum(-1, keepdim=True)).transpose(0, 1).to(q.dtype)
    return out, int(kept), heads * nb * (nb + 1) // 2


def oracle_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None,
                   **kwargs):
    """transformers attention contract (query [B, H, q, d], key/value [B, H_kv, k, d]) → ([B, q, H, d], None):
    ACTIVE's oracle over each whole causal prefill; anything else (a mask, a cache, another scale, dropout, a
    sliding window, soft-capping) is an error."""
    q_len, k_len, d = query.shape[2], key.shape[2], query.shape[-1]
    plain = (attention_mask is None and q_len == k_len and is_causal is not False and dropout == 0.0
             and (scaling is None or math.isclose(scaling, d ** -0.5)) and kwargs.get("sliding_window") is None
             and kwargs.get("softcap") is None)
    if not plain or ACTIVE["oracle"] is None:
        raise ValueError("block_oracle: only a plain causal prefill (no mask, no cache, scaling 1/sqrt(d), no dropout, "
                         f"window or softcap) under use_oracle is supported, got q_len={q_len}, k_len={k_len}, "
                         f"mask={attention_mask is not None}, scaling={scaling}, dropout={dropout}, "
                         f"oracle={ACTIVE['oracle']}")
    outs = []
    for b in range(query.shape[0]):
        out, kept, causal = oracle_attention(*(t[b].transpose(0, 1) for t in (query, key, value)), ACTIVE["oracle"])
        ACTIVE["kept"] += kept
        ACTIVE["causal"] += causal
        outs.append(out)
    return torch.stack(outs), None


def use_oracle(model, oracle: BlockOracle) -> None:
    """Route a loaded model's attention through the oracle (ACTIVE: one oracle at a time) and zero its block count;
    bench.accuracy.use_method switches back."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    from ..hf import crisp_mask
    from ..models import set_attn_implementation

    AttentionInterface.register(NAME, oracle_forward)
    AttentionMaskInterface.register(NAME, crisp_mask)  # None for a plain causal prefill, as CRISP's
    ACTIVE.update(oracle=oracle, kept=0, causal=0)
    set_attn_implementation(model, NAME)


def model_sweep(model, tok, oracles: dict, configs: dict, lengths, sources=CALIBRATION, rope=None,
                kl_positions: int = 2048, progress=None, on_row=None) -> list[dict]:
    """bench.defaults.score rows (untimed) of CRISP configs {name: CrispConfig} and oracles {name: BlockOracle};
    oracle rows add density (kept / causal blocks over every layer), coverage and budget."""
    from .accuracy import use_method
    from .defaults import score

    def crisp(name):
        return lambda m: use_method(m, name, CrispConfig(), configs), lambda: {"config": configs[name].to_dict()}

    def oracle(o):
        return (lambda m: use_oracle(m, o),
                lambda: {"density": ACTIVE["kept"] / max(ACTIVE["causal"], 1), **o.fields()})

    methods = {**{name: crisp(name) for name in configs}, **{name: oracle(o) for name, o in oracles.items()}}
    try:
        return score(model, tok, methods, lengths, sources, rope, kl_positions, repeats=0, progress=progress,
                     on_row=on_row)
    finally:
        ACTIVE.update(oracle=None, kept=0, causal=0)
