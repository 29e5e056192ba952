"""Fit SyntheticSpec to statistics measured on real Q/K/V (DESIGN.md §6: workload b fitted to a).

Statistics (`attention_stats`), per head over the last `rows` query rows of the exact causal softmax,
then averaged over heads:
  sink_share   mass on the first `sink` keys;
  local_share  mass on keys within `local` tokens before the query (excluding the sink);
  top_share    mass on the top-`columns` other key positions (by mean column mass over the rows);
  floor        median / mean mass of the remaining keys (1.0 = exactly uniform noise; lower = a more
               spread-out background), scale-free so it does not depend on the shares above;
  floor_abs    median mass of a remaining key times the row length (the absolute noise level).
`fit_spec(target)` searches the SyntheticSpec logits (sink_logit, local_logit, column_logit) by
coordinate-wise bisection on a log scale so that the synthetic stats at the measurement length match
the target shares; the background noise is set from the measured floor (a lower floor ↔ a wider
spread of background logits). Because the logits, not the shares, are fitted, the generator keeps
the same per-token structure when it is run at 8k→1M: the shares then drift the way a real model's
would if its per-token logits stayed fixed (sink and retrieval mass shrink ∝ log-odds vs n).
"""
from __future__ import annotations

import math
from dataclasses import asdict, replace

import torch

from .synthetic import SyntheticSpec, synthetic_qkv


def attention_stats(q, k, *, rows: int = 64, sink: int = 4, local: int = 64, columns: int = 16) -> dict:
    """q [1 or n.., n, H, d] / [n, H, d], k likewise with H_kv heads → dict of mean shares and floor."""
    if q.dim() == 4:
        q, k = q[0], k[0]
    n, heads, d = q.shape
    kk = k.float().repeat_interleave(heads // k.shape[1], dim=1)
    rows = min(rows, n)
    qi = torch.arange(n - rows, n)
    out = {"sink_share": 0.0, "local_share": 0.0, "top_share": 0.0, "floor": 0.0, "floor_abs": 0.0}
    j = torch.arange(n)
    for h in range(heads):
        logits = (q[n - rows:, h].float() @ kk[:, h].T) / math.sqrt(d)
        logits = logits.masked_fill(j[None, :] > qi[:, None], float("-inf"))
        p = torch.softmax(logits, -1)
        is_sink = j[None, :] < sink
        is_local = (qi[:, None] - j[None, :] < local) & (j[None, :] <= qi[:, None]) & ~is_sink
        rest = ~(is_sink | is_local) & (j[None, :] <= qi[:, None])
        col = (p * rest).mean(0)
        top = torch.topk(col, min(columns, n)).indices
        is_top = torch.zeros(n, dtype=torch.bool)
        is_top[top] = True
        out["sink_share"] += float((p * is_sink).sum(1).mean())
        out["local_share"] += float((p * is_local).sum(1).mean())
        out["top_share"] += float((p * (rest & is_top[None])).sum(1).mean())
        remaining = p[rest & ~is_top[None]]
        if remaining.numel():
            out["floor"] += float(remaining.median() / remaining.mean().clamp_min(1e-30))
            out["floor_abs"] += float(remaining.median() * n)
    return {key: val / heads for key, val in out.items()}


def synthetic_stats(spec: SyntheticSpec, n: int, heads: int = 4, kv_heads: int = 2, head_dim: int = 64,
                    seed: int = 0, **kw) -> dict:
    q, k, _ = synthetic_qkv(n, heads, kv_heads, head_dim, spec=spec, seed=seed)
    return attention_stats(q, k, sink=spec.sink, local=spec.local_width, columns=spec.columns, **kw)


_KNOBS = (("sink_logit", "sink_share"), ("local_logit", "local_share"), ("column_logit", "top_share"))


def fit_spec(target: dict, n: int = 1024, base: SyntheticSpec = SyntheticSpec(), iters: int = 8,
             rounds: int = 3, head_dim: int = 64) -> tuple[SyntheticSpec, dict]:
    """SyntheticSpec whose stats at length n match target's sink/local/top shares; returns (spec, stats)."""
    spec = base
    if target.get("floor"):
        # floor ≈ exp(-σ²/2) for lognormal background weights with logit std σ (median / mean)
        sigma = math.sqrt(max(-2 * math.log(min(max(target["floor"], 1e-3), 0.999)), 0.0))
        spec = replace(spec, noise=max(sigma, 0.05))
    for _ in range(rounds):
        for knob, stat in _KNOBS:
            lo, hi = 0.0, 24.0
            for _ in range(iters):
                mid = 0.5 * (lo + hi)
                got = synthetic_stats(replace(spec, **{knob: mid}), n, head_dim=head_dim)[stat]
                lo, hi = (mid, hi) if got < target[stat] else (lo, mid)
            spec = replace(spec, **{knob: 0.5 * (lo + hi)})
    return spec, synthetic_stats(spec, n, head_dim=head_dim)


FITTED_PATH = __import__("os").path.join(__import__("os").path.dirname(__file__), "fitted_smollm2.json")


def fitted_spec() -> SyntheticSpec:
    """The SyntheticSpec fitted to SmolLM2 real-text statistics (crisp_trt/workloads/fitted_smollm2.json)."""
    import json

    with open(FITTED_PATH) as f:
        return SyntheticSpec(**json.load(f)["spec"])


def spec_to_dict(spec: SyntheticSpec) -> dict:
    return asdict(spec)
