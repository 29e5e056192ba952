"""Choosing the default CrispConfig by the model's answers on calibration text (never evaluation prompts).

For every candidate config and length: whole-model prefill time (bench.e2e.prefill_ms) against dense in
the same run, perplexity of the text, and the mean KL(dense ‖ candidate) of the next-token distributions
over the last `kl_positions` positions (where a long prompt's answer is read). `pick` takes the fastest
candidate whose perplexity rises by at most `max_dppl` and whose KL stays under `max_kl` at every
(length, source), or, where today's default misses a bar, stays within the default's own value there (no new
default less accurate than the old). The bars are fixed before any run; the text is workloads.texts.CALIBRATION.
"""
from __future__ import annotations

import math

import torch

from ..config import CrispConfig
from ..workloads.texts import CALIBRATION

MAX_DPPL = 0.0025   # perplexity may rise by 0.25 % (half the 0.5 % acceptance bar)
MAX_KL = 0.01       # nats, mean over the last positions


def _scores(model, ids: torch.Tensor, kl_positions: int, dense_logp: torch.Tensor | None):
    """(mean NLL over the text, log-probs of its last kl_positions positions, mean KL to dense_logp)."""
    from .accuracy import chunked_logp

    n = ids.shape[1]
    total, tail = 0.0, []
    for a, b, logp in chunked_logp(model, ids):
        total -= float(logp.gather(1, ids[0, a + 1:b + 1, None]).sum())
        if b > n - 1 - kl_positions:
            tail.append(logp[max(0, n - 1 - kl_positions - a):])
    logp = torch.cat(tail)
    kl = None if dense_logp is None else float((dense_logp.exp() * (dense_logp - logp)).sum(-1).mean())
    return total / (n - 1), logp, kl


def score(model, tok, methods: dict, lengths, sources=CALIBRATION, rope=None, kl_positions: int = 2048,
          repeats: int = 3, progress=None, on_row=None) -> list[dict]:
    """Rows per (n, source, method): ttft_ms and speedup (dense's TTFT over it; timed on the first source only,
    None with repeats 0), ppl, dppl (relative to dense), kl, plus the method's own fields. methods: {name:
    (use, fields)}: use(model) switches the model's attention to it, fields() gives the extra row fields after its
    forward; "dense" is scored first. on_row(rows) after each row; the model ends on dense attention."""
    from ..workloads.real import text_ids
    from .accuracy import use_method, use_rope
    from .e2e import prefill_ms

    base = CrispConfig()
    dense = (lambda m: use_method(m, "dense", base), lambda: {})
    rows = []
    try:
        for n in lengths:
            use_rope(model, rope, n)
            for i, source in enumerate(sources):
                ids = text_ids(tok, n, source=source).to(model.device)
                dense_logp, dense_ms, dense_nll = None, None, None
                for name, (use, fields) in {"dense": dense, **methods}.items():
                    use(model)
                    ms = prefill_ms(model, ids, repeats) if i == 0 and repeats else None
                    nll, logp, kl = _scores(model, ids, kl_positions, dense_logp)
                    if name == "dense":
                        dense_logp, dense_ms, dense_nll = logp, ms, nll
                    rows.append(dict(n=n, source=source, method=name, ttft_ms=ms,
                                     speedup=None if ms is None else dense_ms / ms, ppl=math.exp(nll),
                                     dppl=math.exp(nll - dense_nll) - 1.0, kl=kl or 0.0, **fields()))
                    if progress is not None:
                        progress.update(1)
                    if on_row is not None:
                        on_row(rows)
    finally:
        dense[0](model)
    return rows


def sweep(model, tok, candidates: dict, lengths, sources=CALIBRATION, rope=None, kl_positions: int = 2048,
          repeats: int = 3, progress=None) -> list[dict]:
    """score() of candidate configs {name: CrispConfig}, each row with its config (None for dense)."""
    from .accuracy import use_method

    base = CrispConfig()
    methods = {name: (lambda m, name=name: use_method(m, name, base, candidates),
                      lambda cfg=cfg: {"config": cfg.to_dict()}) for name, cfg in candidates.items()}
    rows = score(model, tok, methods, lengths, sources, rope, kl_positions, repeats, progress)
    return [{**r, "config": r.get("config")} for r in rows]


def pick(rows, max_dppl: float = MAX_DPPL, max_kl: float = MAX_KL, incumbent: str | None = "default") -> dict:
    """The fastest candidate (mean speedup over the timed rows) meeting both bars at every (n, source);
    {"name": None} when none does. Where the `incumbent` candidate (today's default, when swept) itself
    misses a bar at some (n, source), the bar there is the incumbent's own value: a new default must be no
    less accurate than the current one, so the incumbent always qualifies. Also lists every candidate's
    worst dppl / kl and mean speedup."""
    names = list(dict.fromkeys(r["method"] for r in rows if r["method"] != "dense"))
    bars = {}
    for r in rows:
        if r["method"] == incumbent:
            bars[r["n"], r["source"]] = (max(max_dppl, r["dppl"]), max(max_kl, r["kl"]))

    def within(r) -> bool:
        dppl_bar, kl_bar = bars.get((r["n"], r["source"]), (max_dppl, max_kl))
        return r["dppl"] <= dppl_bar and r["kl"] <= kl_bar

    table, ok = {}, []
    for name in names:
        rs = [r for r in rows if r["method"] == name]
        timed = [r["speedup"] for r in rs if r["speedup"] is not None]
        table[name] = dict(worst_dppl=max(r["dppl"] for r in rs), worst_kl=max(r["kl"] for r in rs),
                           mean_speedup=sum(timed) / max(1, len(timed)))
        if all(within(r) for r in rs):
            ok.append(name)
    best = max(ok, key=lambda m: table[m]["mean_speedup"], default=None)
    return {"name": best, "max_dppl": max_dppl, "max_kl": max_kl, "incumbent": incumbent if bars else None,
            "candidates": table}
