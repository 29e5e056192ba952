"""The block oracle inside a whole model: how sparse could any block selection be at the model's accuracy bar?

Per head and query block, the oracle keeps the key blocks holding the most dense softmax mass (summed over the
block's rows; the diagonal block always) and attends exactly over them, fp32. Two budgets: `coverage` c keeps
blocks until they hold c of the mass; `budget` cfg keeps as many blocks as CRISP's own plan under cfg lists there
(the same-budget oracle of bench.recall, but for every row of every layer, so the model's answers can be scored).
`model_sweep` scores both the way bench.defaults does (perplexity, KL to dense on the last positions): if even the
oracle moves the answers at a density, no block selection at that density keeps them. No kernel: a bound, slow.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..config import CrispConfig
from ..workloads.texts import CALIBRATION

NAME = "block_oracle"


@dataclass(frozen=True)
class BlockOracle:
    """One oracle budget: coverage in (0, 1], or budget = the CrispConfig whose plan sets the block counts."""
    coverage: float | None = None
    budget: CrispConfig | None = None
    block: int = 128

    def __post_init__(self):
        if (self.coverage is None) == (self.budget is None):
            raise ValueError("BlockOracle: give exactly one of coverage (a fraction in (0, 1]) or budget (a CrispConfig)")
        if self.coverage is not None and not 0.0 < self.coverage <= 1.0:
            raise ValueError(f"BlockOracle: coverage={self.coverage}, expected a fraction in (0, 1]")
        if self.budget is not None and self.budget.block_size != self.block:
            raise ValueError(f"BlockOracle: budget.block_size={self.budget.block_size}, expected block={self.block}")


def _budget_counts(q: torch.Tensor, k: torch.Tensor, cfg: CrispConfig) -> torch.Tensor:
    """Blocks CRISP attends per head and query block (diagonal included) under cfg: int [H, nb]; q [n, H, d]."""
    from ..kernels.pipeline import masks_from_plan
    from .op import method_plan

    n = q.shape[0]
    p = method_plan(q[None], k[None], cfg, max_n=n)
    return masks_from_plan(p, 0, -(-n // cfg.block_size)).sum(-1).to(q.device)


def oracle_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, oracle: BlockOracle,
                     rows_per_step: int | None = None) -> tuple[torch.Tensor, int, int]:
    """(out [n, H, d] in q's dtype, kept blocks, causal blocks) of causal attention of one sequence (q [n, H, d],
    k, v [n, H_kv, d], GQA by repetition) over the oracle's blocks; rows_per_step query rows at a time (default:
    2^30 logits a step, 4 GiB of fp32, whole query blocks)."""
    n, heads, d = q.shape
    block = oracle.block
    rows_per_step = rows_per_step or (1 << 30) // (heads * n)
    group = heads // k.shape[1]
    nb = -(-n // block)
    counts = _budget_counts(q, k, oracle.budget) if oracle.budget is not None else None
    kk = k.float().repeat_interleave(group, 1).transpose(0, 1)            # [H, n, d]
    vv = v.float().repeat_interleave(group, 1).transpose(0, 1)
    out = torch.empty(n, heads, d, dtype=q.dtype, device=q.device)
    step = max(block, rows_per_step // block * block)
    kept = 0
    for a in range(0, n, step):
        b = min(a + step, n)
        nkb, qb0 = -(-b // block), a // block
        logits = (q[a:b].float().transpose(0, 1) @ kk[:, :b].transpose(1, 2)) / math.sqrt(d)  # [H, R, b]
        pos = torch.arange(b, device=q.device)
        logits.masked_fill_(pos[None, None, :] > pos[a:b, None][None], float("-inf"))
        p = torch.softmax(logits, -1)
        del logits
        row_qb = pos[a:b] // block - qb0
        mass = torch.nn.functional.pad(p, (0, nkb * block - b)).view(heads, b - a, nkb, block).sum(-1)
        mass = torch.zeros(heads, nkb - qb0, nkb, device=q.device).index_add_(1, row_qb, mass)  # [H, QB, nkb]
        qb = torch.arange(qb0, nkb, device=q.device)
        kb = torch.arange(nkb, device=q.device)
        diagonal = kb[None] == qb[:, None]
        order = mass.masked_fill(diagonal, float("inf")).argsort(-1, descending=True)  # the diagonal first
        ranked = mass.gather(-1, order)
        if counts is None:
            before = ranked.cumsum(-1) - ranked
            keep_ranked = before < oracle.coverage * mass.sum(-1, keepdim=True)
        else:
            keep_ranked = torch.arange(nkb, device=q.device) < counts[:, qb0:nkb, None]
        keep = torch.zeros_like(keep_ranked).scatter_(-1, order, keep_ranked)
        keep = (keep & (kb[None] <= qb[:, None])) | diagonal  # causal blocks only, the diagonal always
        kept += int(keep.sum())
        p = p * keep[:, row_qb].repeat_interleave(block, -1)[..., :b]
        out[a:b] = ((p @ vv[:, :b]) / p.sum(-1, keepdim=True)).transpose(0, 1).to(q.dtype)
    return out, kept, heads * nb * (nb + 1) // 2


class Counter:
    """Kept and causal blocks over the oracle's calls since the last reset (density = kept / causal)."""
    kept = 0
    causal = 0

    @classmethod
    def reset(cls) -> None:
        cls.kept = cls.causal = 0

    @classmethod
    def density(cls) -> float:
        return cls.kept / max(cls.causal, 1)


def oracle_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None,
                   **kwargs):
    """transformers attention contract (query [B, H, q, d], key/value [B, H_kv, k, d]) → ([B, q, H, d], None):
    the oracle in module.config.block_oracle over each whole causal prefill; anything else is an error."""
    q_len, k_len, d = query.shape[2], key.shape[2], query.shape[-1]
    if attention_mask is not None or q_len != k_len or (scaling is not None and not math.isclose(scaling, d ** -0.5)):
        raise ValueError("block_oracle: only plain causal prefill (no mask, no cache, scaling 1/sqrt(d)) is supported, "
                         f"got q_len={q_len}, k_len={k_len}, mask={attention_mask is not None}, scaling={scaling}")
    oracle = module.config.block_oracle
    outs = []
    for b in range(query.shape[0]):
        out, kept, causal = oracle_attention(*(t[b].transpose(0, 1) for t in (query, key, value)), oracle)
        Counter.kept += kept
        Counter.causal += causal
        outs.append(out)
    return torch.stack(outs), None


def use_oracle(model, oracle: BlockOracle | None) -> None:
    """Route a loaded model's attention through the oracle; None drops it from the config (which then saves as
    before) and leaves attention as it is (bench.accuracy.use_method switches it)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    from ..hf import crisp_mask
    from ..models import set_attn_implementation

    configs = [model.config] + [getattr(model.config, s) for s in ("text_config",) if hasattr(model.config, s)]
    if oracle is None:
        for c in configs:
            c.__dict__.pop("block_oracle", None)
        return
    AttentionInterface.register(NAME, oracle_forward)
    AttentionMaskInterface.register(NAME, crisp_mask)
    for c in configs:
        c.block_oracle = oracle
    set_attn_implementation(model, NAME)


def model_sweep(model, tok, oracles: dict, configs: dict, lengths, sources=CALIBRATION, rope=None,
                kl_positions: int = 2048, progress=None) -> list[dict]:
    """Rows per (n, source, method): ppl, dppl (against dense), kl (dense ‖ method, mean over the last
    kl_positions), and for oracles their density over every layer. oracles: {name: BlockOracle}; configs:
    {name: CrispConfig} scored beside them (CRISP itself, for the pairing)."""
    from ..workloads.real import text_ids
    from .accuracy import use_method, use_rope
    from .defaults import _scores

    base = CrispConfig()
    rows = []
    try:
        for n in lengths:
            use_rope(model, rope, n)
            for source in sources:
                ids = text_ids(tok, n, source=source).to(model.device)
                dense_logp, dense_nll = None, None
                for name in ("dense", *configs, *oracles):
                    if name in oracles:
                        use_oracle(model, oracles[name])
                        Counter.reset()
                    else:
                        use_method(model, name, base, configs)
                    nll, logp, kl = _scores(model, ids, kl_positions, dense_logp)
                    if name == "dense":
                        dense_logp, dense_nll = logp, nll
                    o = oracles.get(name)
                    rows.append(dict(n=n, source=source, method=name, ppl=math.exp(nll),
                                     dppl=math.exp(nll - dense_nll) - 1.0, kl=kl or 0.0,
                                     density=Counter.density() if o else None,
                                     coverage=o.coverage if o else None,
                                     budget=o.budget.to_dict() if o and o.budget else None))
                    if progress is not None:
                        progress.update(1)
    finally:
        use_oracle(model, None)
        use_method(model, "dense", base)
    return rows
