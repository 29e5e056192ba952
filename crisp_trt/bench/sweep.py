"""crisp-bench sweep: which CRISP config keeps a crisp-build artifact's greedy text identical to dense, per length?

Runs the e2e retrieval prompts (crisp_trt.bench.e2e.retrieval_prompt_ids) through dense SDPA and through
each variant: the artifact's calibrated per-layer configs, uniform CrispConfig overrides, and a dense
control (HF eager attention: same math as SDPA, other kernels) that measures how often bf16 noise alone
changes the text. Per variant and length: identical texts, retrieved, mean block density, the dense
next-token KL at the prompt's end, and at each divergence the dense top-1/top-2 logit margin there
(a small margin means a near tie that any rounding can flip). Identity is token equality, greedy stopping
after eos (crisp_trt.bench.e2e.greedy).

    crisp-bench sweep ARTIFACT_DIR --lengths 2k,4k,8k     # writes bench/results/latest/e2e/e2e_sweep.json
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from ..config import CrispConfig

VARIANTS = {  # name -> CrispConfig overrides of every layer (None: the artifact's own per-layer configs),
    # or (layers, overrides): the default config with the overrides on those layers only
    "artifact": None,
    "default": {},
    "cov0.9": {"coverage": 0.9},  # the default before session 5
    "kappa4": {"kappa": 4.0},
    "kappa2": {"kappa": 2.0},
    "kappa0": {"kappa": 0.0},
    "cov0.99": {"coverage": 0.99},
    "kappa4_cov0.99": {"kappa": 4.0, "coverage": 0.99},
    "local2": {"local_blocks": 2},
    "local4": {"local_blocks": 4},
    "budget2k": {"min_budget": 2048},
    "dense_l01": ({0, 1}, {"kappa": 0.0}),
    "b64": {"block_size": 64},
}


def variant_configs(name: str, artifact_configs: list) -> list:
    """Per-layer CrispConfigs of a VARIANTS entry: overrides apply to the artifact's base config (its
    block size and budgets with the default kappa and tau), not on top of its calibrated per-layer kappas."""
    over = VARIANTS[name]
    if over is None:
        return list(artifact_configs)
    default = CrispConfig()
    base = artifact_configs[0].replace(kappa=default.kappa, tau=default.tau)
    layers, changes = over if isinstance(over, tuple) else (range(len(artifact_configs)), over)
    return [base.replace(**changes) if i in layers else base for i in range(len(artifact_configs))]


class DensityMeter:
    """Wraps crisp_trt.hf's op to collect the mean block density of every CRISP prefill call."""

    def __init__(self):
        from crisp_trt import hf

        self.hf, self.op, self.values = hf, hf.crisp_prefill_attention, []

        def recording(q, k, v, config=None):
            out, stats = self.op(q, k, v, config=config, return_stats=True)
            self.values.append(stats.density.float().mean())
            return out

        hf.crisp_prefill_attention = recording

    def close(self) -> None:
        """Put hf's op back (a second sweep in the process would otherwise wrap this wrapper)."""
        self.hf.crisp_prefill_attention = self.op

    def take(self) -> float | None:
        vals, self.values = self.values, []
        return float(torch.stack(vals).mean()) if vals else None


def run_sweep(artifact: str, lengths, trials: int = 10, new_tokens: int = 6, variants=None, device=None) -> dict:
    """The sweep's rows (one per length and variant, printed as they come) and its context."""
    from .. import runtime
    from ..hf import set_crisp_config
    from ..models import set_attn_implementation
    from .e2e import divergence, greedy, retrieval_prompt_ids

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    cm = runtime.load(artifact, device=device, dtype=torch.bfloat16 if device == "cuda" else None)
    tok, hf_model = cm.tokenizer, cm.model
    meter = DensityMeter()
    try:
        names = list(variants or ["eager", *VARIANTS])
        rows, t0 = [], time.time()
        for n in lengths:
            prompts = [retrieval_prompt_ids(tok, n, t, depth=(t + 0.5) / trials) for t in range(trials)]
            prompts = [(ids.to(device), exp) for ids, exp in prompts]
            set_attn_implementation(hf_model, "sdpa")
            eos = tok.eos_token_id
            dense = [greedy(hf_model, ids, new_tokens, eos) for ids, _ in prompts]
            dense_hits = sum(all(w in tok.decode(d[0]) for w in exp[:2]) for d, (_, exp) in zip(dense, prompts))
            for name in names:
                if name == "eager":
                    set_attn_implementation(hf_model, "eager")
                else:
                    set_crisp_config(hf_model, variant_configs(name, cm.layer_configs))
                    set_attn_implementation(hf_model, "crisp")
                same, hits, kls, margins = 0, 0, [], []
                for (ids, exp), (dtoks, dlog) in zip(prompts, dense):
                    toks, logit = greedy(hf_model, ids, new_tokens, eos)
                    text = tok.decode(toks)
                    same += toks == dtoks
                    hits += all(w in text for w in exp[:2])
                    pd, pv = torch.log_softmax(dlog[0], -1), torch.log_softmax(logit[0], -1)
                    kls.append(float((pd.exp() * (pd - pv)).sum()))
                    div = divergence((dtoks, dlog), toks)
                    if div is not None:
                        margins.append(round(div["dense_gap"], 3))
                row = {"n": int(prompts[0][0].shape[1]), "variant": name, "identical": same, "trials": trials,
                       "retrieved": hits, "retrieved_dense": dense_hits, "density": meter.take(),
                       "kl_first_token": sum(kls) / len(kls), "dense_margin_at_divergence": margins}
                rows.append(row)
                print(json.dumps(row), flush=True)
        return {"artifact": str(artifact), "device": device, "rows": rows, "seconds": round(time.time() - t0, 1)}
    finally:
        meter.close()


def write_results(result: dict, out_dir="bench/results/latest/e2e") -> str:
    """e2e_sweep.json in out_dir; returns its path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "e2e_sweep.json"
    path.write_text(json.dumps(result, indent=2))
    return str(path)


def table(rows) -> str:
    lines = [f"{'n':>6} {'variant':<16} {'same':>5} {'hit':>4} {'dens':>6} {'KL':>9}  margins"]
    for r in rows:
        d = "-" if r["density"] is None else f"{r['density']:.3f}"
        lines.append(f"{r['n']:>6} {r['variant']:<16} {r['identical']:>2}/{r['trials']:<2} "
                     f"{r['retrieved']:>2}/{r['retrieved_dense']:<2} {d:>6} {r['kl_first_token']:9.2e}  "
                     f"{r['dense_margin_at_divergence']}")
    return "\n".join(lines)
