"""Fit SyntheticSpec to statistics measured on real Q/K/V (docs/design.md, "Measuring": the synthetic workload fitted to real Q/K/V).

Statistics (`attention_stats`), per head over the last `rows` query rows of the exact causal softmax,
then averaged over heads:
  sink_share        mass on the first `sink` keys;
  local_share       mass on keys within `local` tokens before the query (excluding the sink);
  top_share         mass on the top-`columns` other key positions (by mean column mass over the rows);
  background_share  the rest, 1 − the three above;
  floor             median / mean mass of the remaining keys (1.0 = exactly uniform noise; lower = a
                    heavier-tailed background), scale-free so it does not depend on the shares above;
  floor_abs         median mass of a remaining key times the row length (the absolute noise level);
  band_*, block_*   what CRISP's block selection (B = 128, kappa = 8) sees: distance bands, block floor,
                    kept blocks and their mass (`block_stats`); near_share (64–512 of all ≥ 64 back) fits
                    the generator's distance profile (`decay`).
The length law. `law_through` fits a least-squares line in log2 n through the real statistics at
1k-8k (each share, and ln floor): that line, clamped to valid values, is the documented extrapolation
beyond 8k (slopes and their standard errors go into fitted_smollm2.json). The generator inverts shares
into logits in closed form (synthetic.logits_at), exact for the mean masses; the statistics are means of
per-row ratios, which the heavy-tailed background biases by a few hundredths, growing with n. So
`fit_at(target, n)` finds the nominal spec at one length whose *measured* synthetic statistics match
target (fixed-point iteration in share space), and `fit_length_law` does it for the real statistics at
1k-8k and the law's values at 32k and 128k (near_share: its own line, `near_law`), then fits the line
through those nominal specs (decay included): the shipped
spec, whose synthetic statistics follow SmolLM2 to 8k and the law beyond (checked again at 512k). Run
`python -m crisp_trt.workloads.fit` to re-measure SmolLM2 and rewrite fitted_smollm2.json. `fit_knots`
keeps the nominal specs themselves (mixture.py's layer classes interpolate between them instead of
drawing one line through them).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, replace

import torch

from .synthetic import SyntheticSpec, synthetic_qkv

FITTED_PATH = os.path.join(os.path.dirname(__file__), "fitted_smollm2.json")
SHARES = ("sink_share", "local_share", "top_share")
STATS = SHARES + ("background_share", "floor")
TOLERANCE = {"share_abs": 0.03, "floor_rel": 0.3}  # per-length |synthetic − real| bounds the fit must meet


BANDS = (64, 512, 4096)  # distance-band edges of the band_* statistics (tokens back)
BLOCK_STATS = tuple(f"band_{a}_{b}" for a, b in zip((0,) + BANDS, BANDS + ("inf",))) + (
    "block_floor", "block_kept", "block_kept_mass")


def block_stats(p, qi, *, sink: int = 4, local: int = 64, block: int = 128, kappa: float = 8.0) -> dict:
    """What CRISP's block selection sees, for one head's softmax rows p [rows, n] at query positions qi.

    band_a_b     mass share a ≤ distance < b tokens back (sink keys excluded), mean over rows;
    block_floor  median / mean mass of the candidate key blocks (1 = uniform): blocks 1.. that lie wholly
                 before every row's local window, with their top keys in (the selection sees them);
    block_kept   fraction of candidate blocks whose max column mass exceeds kappa × the median block-mean
                 mass (CRISP's floor rule, column mass = mean over the rows);
    block_kept_mass  share of the candidate blocks' mass in the kept blocks."""
    n = p.shape[1]
    j = torch.arange(n, device=p.device)
    dist = (qi[:, None] - j[None, :]).float()
    dist = dist.masked_fill((dist < 0) | (j[None, :] < sink), -1.0)
    edges = (0,) + BANDS + (float("inf"),)
    out = {name: float((p * ((dist >= a) & (dist < b))).sum(1).mean())
           for name, a, b in zip(BLOCK_STATS, edges[:-1], edges[1:])}
    nb = (int(qi.min()) - local + 1) // block  # blocks [0, nb) hold no local key of any row
    if nb < 2:
        return {**out, "block_floor": 1.0, "block_kept": 0.0, "block_kept_mass": 0.0}
    col = p[:, block: nb * block].mean(0).view(nb - 1, block)
    mass, peak = col.sum(1), col.amax(1)
    kept = peak > kappa * mass.median() / block
    return {**out, "block_floor": float(mass.median() / mass.mean().clamp_min(1e-30)),
            "block_kept": float(kept.float().mean()), "block_kept_mass": float(mass[kept].sum() / mass.sum())}


def attention_stats(q, k, *, rows: int = 64, sink: int = 4, local: int = 64, columns: int = 16) -> dict:
    """q [1, n, H, d] / [n, H, d], k likewise with H_kv heads → dict of mean shares and floor, and the
    block-level statistics of `block_stats`."""
    if q.dim() == 4:
        q, k = q[0], k[0]
    n, heads, d = q.shape
    kk = k.float().repeat_interleave(heads // k.shape[1], dim=1)
    rows = min(rows, n)
    qi = torch.arange(n - rows, n, device=q.device)
    out = {"sink_share": 0.0, "local_share": 0.0, "top_share": 0.0, "floor": 0.0, "floor_abs": 0.0}
    j = torch.arange(n, device=q.device)
    for h in range(heads):
        logits = (q[n - rows:, h].float() @ kk[:, h].T) / math.sqrt(d)
        logits = logits.masked_fill(j[None, :] > qi[:, None], float("-inf"))
        p = torch.softmax(logits, -1)
        is_sink = j[None, :] < sink
        is_local = (qi[:, None] - j[None, :] < local) & (j[None, :] <= qi[:, None]) & ~is_sink
        rest = ~(is_sink | is_local) & (j[None, :] <= qi[:, None])
        col = (p * rest).mean(0)
        is_top = torch.zeros(n, dtype=torch.bool, device=q.device)
        is_top[torch.topk(col, min(columns, n)).indices] = True
        out["sink_share"] += float((p * is_sink).sum(1).mean())
        out["local_share"] += float((p * is_local).sum(1).mean())
        out["top_share"] += float((p * (rest & is_top[None])).sum(1).mean())
        remaining = p[rest & ~is_top[None]]
        if remaining.numel():
            out["floor"] += float(remaining.median() / remaining.mean().clamp_min(1e-30))
            out["floor_abs"] += float(remaining.median() * n)
        for key, val in block_stats(p, qi, sink=sink, local=local).items():
            out[key] = out.get(key, 0.0) + val
    out = {key: val / heads for key, val in out.items()}
    out["background_share"] = max(1.0 - sum(out[s] for s in SHARES), 0.0)
    return out


def synthetic_stats(spec: SyntheticSpec, n: int, heads: int = 8, kv_heads: int = 4, head_dim: int = 64,
                    seeds=(0, 1, 2, 3), **kw) -> dict:
    """attention_stats of the synthetic workload at length n, averaged over `seeds`."""
    runs = []
    for seed in seeds:
        q, k, _ = synthetic_qkv(n, heads, kv_heads, head_dim, spec=spec, seed=seed)
        runs.append(attention_stats(q, k, sink=spec.sink, local=spec.local_width, columns=spec.columns, **kw))
    return {key: sum(r[key] for r in runs) / len(runs) for key in runs[0]}


def near_share(stats: dict) -> float:
    """Mass 64–512 tokens back over all mass ≥ 64 back (sink excluded): the distance profile's one number."""
    return stats["band_64_512"] / max(stats["band_64_512"] + stats["band_512_4096"] + stats["band_4096_inf"], 1e-9)


def fit_at(target: dict, n: int, start: SyntheticSpec | None = None, iters: int = 6,
           head_dim: int = 64) -> tuple[SyntheticSpec, dict]:
    """Spec (ref_n = n, no slopes) whose synthetic stats at length n match target's shares and floor:
    each nominal share moves by (target − measured), ln floor by ln(target / measured), and, when target
    has the distance bands (or a "near_share"), decay by a secant step on near_share. (spec, stats)."""
    near = target.get("near_share", near_share(target) if "band_64_512" in target else None)
    start = start or SyntheticSpec(**{s: target[s] for s in SHARES}, floor=target["floor"],
                                   decay=0.0 if near is None else 1.5)
    spec, last = start.at(n), None
    for _ in range(iters):
        got = synthetic_stats(spec, n, head_dim=head_dim)
        moves = {s: min(max(getattr(spec, s) + target[s] - got[s], 1e-4), 0.98) for s in SHARES}
        floor = spec.floor * target["floor"] / max(got["floor"], 1e-6)
        decay = spec.decay
        if near is not None:
            slope = 0.3 if last is None or abs(spec.decay - last[0]) < 1e-3 else \
                (near_share(got) - last[1]) / (spec.decay - last[0])
            last = spec.decay, near_share(got)
            decay = min(max(spec.decay + (near - last[1]) / max(slope, 0.05), 0.0), 4.0)
        spec = replace(spec, **moves, floor=min(max(floor, 1e-6), 0.999), decay=decay).at(n)
    return spec, synthetic_stats(spec, n, head_dim=head_dim)


def _line(xs, ys) -> tuple[float, float, float]:
    """Least-squares y = a + b·x: (a, b, standard error of b)."""
    k = len(xs)
    mx, my = sum(xs) / k, sum(ys) / k
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    rss = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys))
    return a, b, math.sqrt(rss / max(k - 2, 1) / sxx)


def law_through(points: dict[int, dict], ref_n: int = 8192, keys=SHARES + ("floor",)) -> tuple[SyntheticSpec, dict]:
    """SyntheticSpec whose length law is the least-squares line in log2(n / ref_n) through points
    ({n: {key: value}}; ln floor for the floor; keys may add "decay"), and {key: slope standard error}."""
    xs = [math.log2(n / ref_n) for n in points]
    values, se = {}, {}
    for s in keys:
        ys = [math.log(p[s]) if s == "floor" else p[s] for p in points.values()]
        a, b, se[s] = _line(xs, ys)
        values[s] = math.exp(a) if s == "floor" else a
        values[s.replace("share", "slope") if s in SHARES else s + "_slope"] = b
    return SyntheticSpec(ref_n=ref_n, **values), se


def near_law(real: dict[int, dict], ref_n: int = 8192) -> tuple[float, float, float]:
    """Least-squares line in log2(n / ref_n) through the real near_share: (at ref_n, slope, its error)."""
    return _line([math.log2(n / ref_n) for n in real], [near_share(p) for p in real.values()])


def law_goal(law: SyntheticSpec, real: dict[int, dict], n: int, ref_n: int = 8192) -> dict:
    """The goal at an extrapolated length n: the law's shares and floor, and near_share on its own line."""
    near, near_slope, _ = near_law(real, ref_n)
    return {**law.shares_at(n), "near_share": min(max(near + near_slope * math.log2(n / ref_n), 0.01), 0.99)}


def fit_knots(real: dict[int, dict], ref_n: int = 8192, extrapolate=(32768, 131072), head_dim: int = 64,
              refine: int = 0):
    """(law, slope_se, goals, nominal): `law` is the line through the real statistics (law_through), the
    documented extrapolation; the goals are the real statistics at the measured lengths and the law's
    values at `extrapolate`; nominal[n] is the spec that fit_at finds for goal n (in increasing n, each
    started from the previous length's nominal − goal offset), so its synthetic statistics at n are the
    goal's. `refine` > 0: up to that many more fit_at rounds (2 iterations each) while a goal is missed."""
    law, slope_se = law_through(real, ref_n)
    goals = {**real, **{n: law_goal(law, real, n, ref_n) for n in extrapolate}}
    nominal, prev = {}, None
    for n in sorted(goals):
        nominal[n] = next_knot(goals[n], n, prev, head_dim, refine)
        prev = goals[n], nominal[n]
    return law, slope_se, goals, nominal


def next_knot(goal: dict, n: int, prev: tuple | None = None, head_dim: int = 64, refine: int = 0) -> SyntheticSpec:
    """fit_at for `goal` at n (6 iterations, or 3 when started from prev = (previous goal, its nominal spec):
    the previous nominal − goal offset applied to this goal, and its decay); then up to `refine` more rounds
    of 2 iterations while the goal is missed."""
    if prev is None:
        start = SyntheticSpec(**{s: min(max(goal[s], 1e-4), 0.98) for s in SHARES}, floor=min(goal["floor"], 0.999),
                              decay=1.0)
    else:
        last_goal, last = prev
        start = SyntheticSpec(**{s: min(max(goal[s] + getattr(last, s) - last_goal[s], 1e-4), 0.98) for s in SHARES},
                              floor=min(goal["floor"] * last.floor / last_goal["floor"], 0.999), decay=last.decay)
    fitted, got = fit_at(goal, n, start=start, iters=6 if prev is None else 3, head_dim=head_dim)
    for _ in range(refine):
        if within_tolerance(goal, got):
            break
        fitted, got = fit_at(goal, n, start=fitted, iters=2, head_dim=head_dim)
    return fitted


def fit_length_law(real: dict[int, dict], ref_n: int = 8192, extrapolate=(32768, 131072), head_dim: int = 64):
    """(spec, law, slope_se, goals): fit_knots, then `spec` = the line through its nominal specs, so its
    synthetic statistics follow the real ones to 8k and the law beyond, as far as one line can."""
    law, slope_se, goals, nominal = fit_knots(real, ref_n, extrapolate, head_dim)
    spec, _ = law_through({n: asdict(s) for n, s in nominal.items()}, ref_n, SHARES + ("floor", "decay"))
    return spec, law, slope_se, goals


def within_tolerance(real: dict, synth: dict) -> bool:
    return (all(abs(real[s] - synth[s]) <= TOLERANCE["share_abs"] for s in STATS[:-1])
            and abs(synth["floor"] / real["floor"] - 1) <= TOLERANCE["floor_rel"])


def stats_of(captured: dict, lengths) -> dict[int, dict]:
    """{n: attention_stats averaged over the captured layers} for each n of `lengths`, from one capture
    ({layer: (q, k, v)} of workloads.real.capture) at ≥ max(lengths) tokens: the model is causal, so the first
    n tokens' Q/K are those of a length-n run on the same text (below a YaRN switch)."""
    out = {}
    for n in lengths:
        per = [attention_stats(q[0, :n], k[0, :n]) for q, k, _ in captured.values()]
        out[n] = {key: sum(p[key] for p in per) / len(per) for key in per[0]}
    return out


def measure_real(lengths=(1024, 2048, 4096, 8192), layers=(0, 5, 10, 15, 20, 25, 29)) -> dict[int, dict]:
    """{n: attention_stats averaged over layers} of SmolLM2 on real text (one capture at max(lengths))."""
    from .real import capture_qkv

    return stats_of(capture_qkv(max(lengths), layers=layers), lengths)


def fitted_spec() -> SyntheticSpec:
    """The SyntheticSpec fitted to SmolLM2 real-text statistics (crisp_trt/workloads/fitted_smollm2.json)."""
    with open(FITTED_PATH) as f:
        return SyntheticSpec(**json.load(f)["spec"])


def _shown(stats: dict, keys=STATS) -> str:
    """The printed form of a statistics row: keys' values, 3 decimals, NaN where absent."""
    return " / ".join(f"{stats.get(key, float('nan')):.3f}" for key in keys)


def check_fit(spec_at, goals: dict, law: SyntheticSpec, measured, validate=(524288,), label: str = "") -> dict:
    """{str(n): goal ("real" at the `measured` lengths, else "law"), synthetic statistics, within_tolerance}
    for every goal of fit_length_law and the `validate` lengths beyond it (against the law), the synthetic
    workload at n being spec_at(n) (e.g. SyntheticSpec.at); printed as it goes (shares and floor, then the
    block statistics)."""
    rows = {}
    for n in sorted(goals) + list(validate):
        goal = goals.get(n) or law.shares_at(n)
        kind = "real" if n in measured else "law"
        synth = synthetic_stats(spec_at(n), n, seeds=(0, 1, 2, 3) if n <= 8192 else (0, 1))
        rows[str(n)] = {kind: goal, "synthetic": synth, "within_tolerance": within_tolerance(goal, synth)}
        print(label, n, f"{kind:4}", _shown(goal), "| synthetic", _shown(synth), rows[str(n)]["within_tolerance"],
              "| blocks", _shown(goal, BLOCK_STATS), "| synthetic", _shown(synth, BLOCK_STATS), flush=True)
    return rows


def measured_within_tolerance(rows: dict) -> bool:
    """Does a check_fit table meet the tolerance at every measured (real) length?"""
    return all(r["within_tolerance"] for r in rows.values() if "real" in r)


def write_fit(record: dict, path: str, ok: bool) -> str:
    """Write a fit record to `path`, or to `path`.rejected when not `ok` (a fit that misses is never shipped)."""
    if not ok:
        path += ".rejected"
        print("outside tolerance: written to", path)
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
    return path


def fit_record(real: dict[int, dict], source: str, ref_n: int = 8192, extrapolate=(32768, 131072),
               validate=(524288,)) -> tuple[dict, bool]:
    """Fit the length law to `real` ({n: statistics}), check every goal (and `validate`, lengths beyond the fit,
    against the law): (the record a fitted_*.json holds, whether every measured length is within tolerance)."""
    spec, law, slope_se, goals = fit_length_law(real, ref_n, extrapolate)
    rows = check_fit(spec.at, goals, law, real, validate)
    lo, hi = min(real), max(real)
    record = {
        "source": source, "tolerance": TOLERANCE, "spec": asdict(spec),
        "law": {"spec": asdict(law), "slope_se": slope_se,
                "note": f"least-squares line in log2 n through the real statistics at {lo}-{hi} tokens (ln floor "
                        f"for the floor); beyond {hi} an extrapolation"},
        "near_law": dict(zip(("at_ref_n", "slope", "slope_se"), near_law(real, ref_n))),
        "lengths": rows,
    }
    return record, measured_within_tolerance(rows)


def prediction(record: dict, real: dict[int, dict]) -> dict:
    """How far a fit's predictions are from real statistics at lengths it did not see: per n of `real`, the
    law's and the fitted spec's synthetic statistics beside the real ones, and their largest |Δshare| and
    floor ratio."""
    law, spec = SyntheticSpec(**record["law"]["spec"]), SyntheticSpec(**record["spec"])
    out = {}
    for n, got in sorted(real.items()):
        synth = synthetic_stats(spec.at(n), n, seeds=(0, 1))
        row = {"real": got, "law": law.shares_at(n), "synthetic": synth}
        for name in ("law", "synthetic"):
            row[f"{name}_max_share_abs"] = max(abs(row[name][s] - got[s]) for s in STATS[:-1])
            row[f"{name}_floor_ratio"] = row[name]["floor"] / got["floor"]
        out[str(n)] = row
        print(f"predicted {n}: real", _shown(got), "| law", _shown(row["law"]), "| synthetic", _shown(synth),
              flush=True)
    return out


def measured(path: str, lengths, corpus: str | None = None, arg: str = "--lengths") -> dict[int, dict]:
    """{n: statistics} at `lengths` from a torch.save'd capture (stats_of) or from a stats JSON measured elsewhere
    (scripts/device/qwen_long.py stats: {"stats": {corpus: {n: statistics}}}), e.g. on the GPU machine; `arg`
    names the option the lengths came from in the errors."""
    if not path.endswith(".json"):
        if corpus is not None:
            raise ValueError(f"--corpus={corpus!r}: only for a stats JSON, and {path} is a capture")
        return stats_of(torch.load(path), lengths)
    with open(path) as f:
        corpora = json.load(f)["stats"]
    if corpus not in corpora:
        raise ValueError(f"--corpus={corpus!r}: expected one of {', '.join(corpora)} (the corpora in {path})")
    missing = [n for n in lengths if str(n) not in corpora[corpus]]
    if missing:
        raise ValueError(f"{arg}: {missing} not measured in {path} for {corpus} (it has "
                         f"{', '.join(corpora[corpus])})")
    return {n: corpora[corpus][str(n)] for n in lengths}


def main(argv=None) -> None:
    """Re-measure and refit. Without --capture: SmolLM2 at 1k-8k → fitted_smollm2.json (the shipped spec).
    With --capture (a torch.save of workloads.real.capture, e.g. the Qwen model at 32k): its statistics at
    --lengths, the law through them, and with --predict the real statistics at longer lengths (from a longer
    capture) against what the fit predicts there. A fit that misses the tolerance is written as `.rejected`."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m crisp_trt.workloads.fit", description=main.__doc__)
    ap.add_argument("--capture", help="torch.save'd {layer: (q, k, v)} from workloads.real.capture, or a stats JSON "
                                      "(scripts/device/qwen_long.py stats) with --corpus")
    ap.add_argument("--corpus", help="with a stats JSON: which corpus's statistics to fit (e.g. code_calib)")
    ap.add_argument("--source", default="", help="what the capture is (model, text, lengths): goes into the record")
    ap.add_argument("--lengths", default="1024,2048,4096,8192", help="comma-separated token counts to fit at")
    ap.add_argument("--ref-n", type=int, default=8192, help="the law's reference length")
    ap.add_argument("--extrapolate", default="32768,131072", help="lengths where the law sets the goals")
    ap.add_argument("--validate", default="524288", help="lengths checked against the law only")
    ap.add_argument("--predict", nargs="*", default=(), metavar="CAPTURE:N,N",
                    help="longer captures (or stats JSONs) and the lengths to compare the fit's predictions at")
    ap.add_argument("--out", help=f"where the record goes (default {FITTED_PATH}; required with --capture, so "
                                  "another model's fit never overwrites the shipped SmolLM2 spec)")
    args = ap.parse_args(argv)
    if args.capture and not args.out:
        ap.error("--out: expected a path for the record when --capture is given (e.g. fitted_qwen.json)")
    ints = lambda text: tuple(int(x) for x in text.split(",") if x)  # noqa: E731
    try:  # every input is read (and checked) before the fit, which takes minutes
        real = measured(args.capture, ints(args.lengths), args.corpus) if args.capture else None
        later = [measured(path, ints(lengths), args.corpus, arg=f"--predict {item}")
                 for item in args.predict for path, _, lengths in [item.rpartition(":")]]
    except (ValueError, FileNotFoundError) as e:
        ap.error(str(e))
    if args.capture:
        source = args.source or f"{args.capture} {args.corpus or ''}".strip()
    else:
        real = measure_real(ints(args.lengths))
        source = ("SmolLM2-135M-Instruct Q4_1 GGUF, post-RoPE Q/K, first n tokens of /usr/share/common-licenses "
                  "(Debian base-files), last 64 query rows, layers 0,5,10,15,20,25,29, all 9 heads, mean over layers")
    record, ok = fit_record(real, source, args.ref_n, ints(args.extrapolate), ints(args.validate))
    for real_n in later:
        record.setdefault("predictions", {}).update(prediction(record, real_n))
    write_fit(record, args.out or FITTED_PATH, ok)


if __name__ == "__main__":
    main()
