"""Per-layer calibration of CRISP's kappa (noise-floor multiplier) and tau (routing threshold).

The paper leaves per-model threshold tuning open. Here: run the model once on calibration text,
capture every layer's post-RoPE Q and K (crisp_trt.workloads.real.capture), and per layer and head measure the
estimate statistics (noise floor, sink mass, local mass, C_struct) with crisp_trt.reference (estimate, route).
Then, per layer, search a fixed grid of (kappa, tau) for the lowest block density whose attention-mass recall
is at least `recall` (default 0.98); ties prefer the global default. Recall is the benchmarks' measure
(crisp_trt.bench.recall: dense causal softmax mass inside the attended blocks, on the same sampled rows), so
calibration's 0.98 and crisp-bench's recall are the same number. The grid stops at the base kappa: a
calibration may make a layer denser than the default, never sparser, because kappas picked above it on
2k tokens kept recall there but not at 8k (SmolLM2 on the H200: greedy text identical to dense in 5 of 10
retrieval prompts at 8k, bench/results/session4_model_c2k). Deterministic: fixed text, fixed grid,
fixed row sample, no randomness beyond the seeded text generator.
"""
from __future__ import annotations

import hashlib
import random

import torch

from crisp_trt import reference
from crisp_trt.bench.recall import block_mass
from crisp_trt.config import CrispConfig

KAPPAS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)  # the grid, cut at the base config's kappa (see above)
TAUS = (0.0, 0.3, 0.5, 0.7, 0.9)

_TEXT = (
    "The committee met on a grey morning to review the harbour accounts. The treasurer reported that "
    "the fishing fleet had landed more cod than in any year since the storm, while the price of salt had "
    "doubled. A long discussion followed about whether the old lighthouse should be repaired or replaced "
    "by an electric beacon on the northern pier. In the end the members agreed to ask the engineer from "
    "the city for an estimate before the spring tides. "
    "def merge(left, right):\n    out = []\n    while left and right:\n        out.append(left.pop(0) "
    "if left[0] <= right[0] else right.pop(0))\n    return out + left + right\n"
    "Photosynthesis converts light energy into chemical energy stored in glucose. Chlorophyll absorbs "
    "mostly blue and red light and reflects green, which is why leaves look green to us. "
)
_WORDS = ("amber", "basalt", "cedar", "delta", "ember", "fjord", "garnet", "harbor", "indigo", "juniper",
          "kelp", "lantern", "marble", "nectar", "obsidian", "pepper", "quartz", "raven", "saffron", "tundra")


def calibration_text(tokens: int, seed: int = 0) -> str:
    """Deterministic mixed text (prose, code, planted word sequences to retrieve) of >= `tokens` tokens."""
    rng = random.Random(seed)
    parts, words = [], 0
    while words < tokens:  # ~1.3 tokens per word: words >= tokens is always enough
        parts.append(_TEXT)
        planted = " ".join(rng.choice(_WORDS) for _ in range(8))
        parts.append(f" Remember the sequence: {planted}. ")
        words += len(_TEXT.split()) + 12
    parts.append(" Now repeat the first sequence:")
    return "".join(parts)


def head_statistics(est: reference.Estimate, sel: reference.HeadSelection, cfg: CrispConfig, n: int) -> dict:
    """Noise floor, sink mass, local mass and C_struct per head (the estimate statistics of §3)."""
    nb = est.vsum.shape[1]
    sink, local = min(cfg.sink_blocks, nb), min(cfg.local_blocks, nb)
    width = torch.full((nb,), float(cfg.block_size))
    width[-1] = n - (nb - 1) * cfg.block_size
    lo, hi = sink, max(sink, nb - 1 - local)
    floors = []
    for h in range(est.vsum.shape[0]):
        means = (est.vsum[h, lo:hi] / width[lo:hi]) if hi > lo else torch.zeros(1)
        floors.append(float(torch.quantile(means, cfg.floor_quantile)) if means.numel() else 0.0)
    r = lambda t: [round(float(x), 6) for x in t]  # noqa: E731
    return {"noise_floor": [round(f, 8) for f in floors], "sink_mass": r(est.vsum[:, :sink].sum(1)),
            "local_mass": r(est.ssum[:, :local].sum(1)), "c_struct": r(sel.c_struct),
            "route": [int(x) for x in sel.route]}


def grid_kappas(base: CrispConfig) -> tuple[float, ...]:
    """The kappas searched: the grid up to the base kappa, which is always included."""
    return tuple(sorted({k for k in KAPPAS if k <= base.kappa} | {base.kappa}))


def calibrate_layer(q: torch.Tensor, k: torch.Tensor, base: CrispConfig, recall: float = 0.98,
                    row_samples: int = 64) -> dict:
    """Choose (kappa, tau) for one layer; q [n,H,d], k [n,Hkv,d] (one sequence, post-RoPE)."""
    n = q.shape[0]
    cfg0 = base.replace(dense_below=0)
    est = reference.estimate(q, k, cfg0)
    rows, mass = block_mass(q, k, cfg0.block_size, row_samples)
    results = []
    for kappa in grid_kappas(base):
        cfg_k = cfg0.replace(kappa=kappa)
        sel = reference.route(est, q, k, cfg_k)
        # masks of each head under either route (tau only picks between them per head)
        per_route = {}
        for name, route in (("vs", reference.ROUTE_VERTICAL_SLASH), ("bs", reference.ROUTE_BLOCK_SPARSE)):
            masks = reference.select(q, k, sel, cfg_k, route=route)
            kept = (mass * masks[:, rows // cfg0.block_size]).sum(-1).mean(-1)
            per_route[name] = (kept, reference.density(masks))
        for tau in TAUS:
            is_vs = sel.c_struct >= tau
            rec = torch.where(is_vs, per_route["vs"][0], per_route["bs"][0])
            dens = torch.where(is_vs, per_route["vs"][1], per_route["bs"][1])
            results.append({"kappa": kappa, "tau": tau, "recall": float(rec.mean()),
                            "min_head_recall": float(rec.min()), "density": float(dens.mean())})
    ok = [r for r in results if r["recall"] >= recall]
    default = (base.kappa, base.tau)
    key = lambda r: (round(r["density"], 6), (r["kappa"], r["tau"]) != default, -r["kappa"], r["tau"])  # noqa: E731
    best = min(ok, key=key) if ok else max(results, key=lambda r: (r["recall"], -r["density"]))
    default_row = next((r for r in results if (r["kappa"], r["tau"]) == default), None)
    sel_best = reference.route(est, q, k, cfg0.replace(kappa=best["kappa"], tau=best["tau"]))
    out = {k2: round(v, 6) if isinstance(v, float) else v for k2, v in best.items()}
    out["met"] = bool(ok)
    out["default"] = default_row and {k2: round(v, 6) for k2, v in default_row.items()}
    out["heads"] = head_statistics(est, sel_best, cfg0.replace(kappa=best["kappa"]), n)
    return out


def calibrate(model, tokenizer, tokens: int = 512, base: CrispConfig | None = None, recall: float = 0.98,
              seed: int = 0, progress: bool = True) -> tuple[CrispConfig, dict]:
    """Run the model on calibration text; returns (the CRISP config to use, the calibration record)."""
    from tqdm import tqdm

    from crisp_trt.workloads.real import capture

    base = base or CrispConfig()
    torch.manual_seed(seed)
    text = calibration_text(tokens, seed)
    ids = tokenizer(text, return_tensors="pt").input_ids[:, :tokens]
    captured = capture(model, ids)
    layers = []
    for idx in tqdm(sorted(captured), desc="calibrating layers", disable=not progress):
        q, k, _ = captured[idx]
        layer = calibrate_layer(q[0], k[0], base, recall)
        layer["layer"] = idx
        layers.append(layer)
    confirmed = all((l["kappa"], l["tau"]) == (base.kappa, base.tau) for l in layers)
    record = {
        "tokens": int(ids.shape[1]), "seed": seed, "recall_target": recall, "block_size": base.block_size,
        "text_sha256": hashlib.sha256(text.encode()).hexdigest()[:16],
        "grid": {"kappa": list(grid_kappas(base)), "tau": list(TAUS)},
        "defaults_confirmed": confirmed,
        "all_met": all(l["met"] for l in layers),
        "mean_recall": round(sum(l["recall"] for l in layers) / max(1, len(layers)), 6),
        "mean_density": round(sum(l["density"] for l in layers) / max(1, len(layers)), 6),
        "layers": layers,
    }
    return base, record
