"""`crisp-bench frontier`: speedup-vs-error curves of CRISP and FlexPrefill-mode on the same inputs.

One default config per method gives one (speedup, error) point each, which cannot say whether CRISP is
faster than FlexPrefill-mode *at equal or lower error* (issue 3). Here each method sweeps a grid of its
budget knobs — CRISP `max_budget` (the cap that sets its density at long n), FlexPrefill-mode `gamma`
with and without that cap — and every point is timed against cuDNN in the same run, on the same input.
`compare` answers the question per length: for each FlexPrefill-mode point, CRISP's fastest point at no
more error, and whether it is faster. Every point also carries the same-budget oracle's error (the best
blocks at the plan's per-row counts) beside its plan's, both on 8 whole query blocks spread over the
sequence (the plan's there estimates its full-sequence error): where the oracle misses a target, no block
selection of that density meets it, whatever the method.
Writes frontier_latest.json and frontier.png (default folder: bench/results/latest/frontier/).
"""
from __future__ import annotations

import itertools
import json
import math
import os

import torch

from ..api import dense_prefill_attention
from ..config import CrispConfig, method_config
from ..lengths import parse_length
from .op import DENSE, SHAPES, SYNTHETIC, dense_fn, gpu_name, median_ms, sparse_numbers, synthetic_input

SWEEPS = {"crisp": "max_budget=4k,8k,12k,16k,24k,32k,64k,128k,1M", "flexprefill": "gamma=0.9,0.95,0.98,0.99;max_budget=16k,1M"}
POINT_KEYS = ("n", "method", "knobs", "workload", "ms", "speedup_vs_cudnn", "density", "rel_error", "recall",
              "sampled_error", "oracle_error", "cudnn_ms", "gpu")
ORACLE_ROWS = 1024
_KNOB_TYPES = {name: type(getattr(CrispConfig(), name)) for name in CrispConfig.__dataclass_fields__}


def _int_knob(text: str) -> int:
    """An int knob's value: 0 or a length as users type them (16k, 1M, 131072)."""
    return 0 if text == "0" else parse_length(text)


def parse_sweep(text: str) -> list[dict]:
    """'gamma=0.9,0.95;max_budget=16k,1M' → the grid of knob settings (a list of dicts, cartesian product).
    Int knobs take 0 or lengths (16k, 1M), float knobs numbers, str knobs words; names, values, empty
    axes and repeated knobs are checked here, ranges by CrispConfig."""
    axes, names = [], set()
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, sep, values = part.partition("=")
        name = name.strip()
        if not sep or not values.strip():
            raise ValueError(f"sweep {part!r}: expected knob=v1,v2,... (e.g. max_budget=16k,32k)")
        if name not in _KNOB_TYPES:
            raise ValueError(f"sweep knob {name!r}: expected a CrispConfig field, one of {sorted(_KNOB_TYPES)}")
        if name in names:
            raise ValueError(f"sweep knob {name!r} given twice: expected each knob once")
        names.add(name)
        kind = _KNOB_TYPES[name]
        cast = {int: _int_knob, float: float}.get(kind, str)
        axis = []
        for v in filter(None, (v.strip() for v in values.split(","))):
            try:
                axis.append((name, cast(v)))
            except ValueError:
                expected = {int: "0 or a length like 16k or 131072", float: "a number"}[kind]
                raise ValueError(f"sweep knob {name}={v!r}: expected {expected}") from None
        if not axis:
            raise ValueError(f"sweep knob {name!r}: expected at least one value")
        axes.append(axis)
    if not axes:
        raise ValueError(f"sweep {text!r}: expected at least one knob=v1,v2,...")
    return [dict(combo) for combo in itertools.product(*axes)]


def sweep_configs(method: str, grid: list[dict], n: int, base: CrispConfig | None = None) -> list[tuple[dict, CrispConfig]]:
    """(knobs, config) of a method's grid at length n; settings that select the same as an earlier one at
    this n (a max_budget at or past n) are dropped, so a cap that cannot bind is measured once."""
    out, seen = [], set()
    for knobs in grid:
        cfg = method_config(method, base).replace(**knobs)
        whole = -(-n // cfg.block_size) * cfg.block_size  # a cap at or past n, in whole blocks, cannot bind
        key = cfg.replace(max_budget=min(cfg.max_budget, max(whole, cfg.min_budget, cfg.block_size)))
        if key not in seen:
            seen.add(key)
            out.append((knobs, cfg))
    return out


def sweep_plan(lengths, sweeps=None, base: CrispConfig | None = None) -> dict[int, list[tuple[str, dict, CrispConfig]]]:
    """Per length, the (method, knobs, config) points to measure; every grid is parsed and every config
    built here, before any input is generated, so a bad knob fails at once. A blank grid leaves its method out."""
    grids = {m: parse_sweep(s) for m, s in (sweeps or SWEEPS).items() if s.strip()}
    return {n: [(m, knobs, cfg) for m, grid in grids.items() for knobs, cfg in sweep_configs(m, grid, n, base)]
            for n in lengths}


def run_frontier(lengths=(2048,), shape="smollm2", workload="synthetic", sweeps=None, repeats=5, device="cpu",
                 dtype=None, base: CrispConfig | None = None, recall_max_n: int = 16384, progress=None,
                 on_points=None) -> list[dict]:
    """Points (dicts with POINT_KEYS) of every method's sweep at every length, cuDNN timed in the same run;
    `progress` (a tqdm bar) gets its total from the plan and a step per point."""
    if workload not in SYNTHETIC:
        raise ValueError(f"workload={workload!r}: expected one of {sorted(SYNTHETIC)}")
    if shape not in SHAPES:
        raise ValueError(f"shape={shape!r}: expected one of {sorted(SHAPES)}")
    todo = sweep_plan(lengths, sweeps, base)
    if progress is not None:  # a tqdm bar: one step per point
        progress.reset(total=sum(len(v) for v in todo.values()))
    dtype = dtype or (torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32)
    gpu, points = gpu_name(device), []
    for n in lengths:
        wname, (q, k, v) = synthetic_input(workload, shape, n, None, device, dtype)
        ref = dense_prefill_attention(q, k, v).float()
        cudnn_ms = median_ms(dense_fn(DENSE[0], q, k, v), repeats, device)
        for method, knobs, cfg in todo[n]:
            row = sparse_numbers(q, k, v, cfg, ref, repeats, device, recall_max_n, routing=False,
                                 oracle_rows=ORACLE_ROWS)
            row.update(n=n, method=method, knobs=knobs, workload=wname, cudnn_ms=cudnn_ms, gpu=gpu,
                       speedup_vs_cudnn=cudnn_ms / row["ms"])
            points.append({key: row[key] for key in POINT_KEYS})
            if progress is not None:
                progress.update(1)
            if on_points is not None:
                on_points(points)
        del q, k, v, ref
    return points


def pareto(points: list[dict]) -> list[dict]:
    """The points that no other point matches on both speedup and error while beating it on one (weakly
    dominated points go too), in ascending error."""
    front = []
    for p in sorted(points, key=lambda p: (p["rel_error"], -p["speedup_vs_cudnn"])):
        if not front or p["speedup_vs_cudnn"] > front[-1]["speedup_vs_cudnn"]:
            front.append(p)
    return front


def speedup_at(front: list[dict], error: float) -> float | None:
    """Speedup of a Pareto front at `error`, linear in log error and log speedup between its points;
    None outside the front's error range (no extrapolation). A segment from a zero-error point has no log:
    there the lower point's speedup holds up to (not including) the next point's error."""
    for a, b in zip(front, front[1:] + front[-1:]):
        if a["rel_error"] <= error <= b["rel_error"]:
            if b["rel_error"] <= a["rel_error"] or a["rel_error"] <= 0:
                return b["speedup_vs_cudnn"] if error == b["rel_error"] else a["speedup_vs_cudnn"]
            t = math.log(error / a["rel_error"]) / math.log(b["rel_error"] / a["rel_error"])
            return math.exp((1 - t) * math.log(a["speedup_vs_cudnn"]) + t * math.log(b["speedup_vs_cudnn"]))
    return None


def compare(points: list[dict], fast: str = "crisp", other: str = "flexprefill") -> list[dict]:
    """Per length and per `other` point: `fast`'s quickest measured point with error ≤ that point's error
    and whether it is at least as fast (`faster`, the literal test), and `fast`'s speedup at exactly that
    error on its Pareto front (`speedup_at_equal_error`, interpolated; None outside its measured range).
    `dominates` per length: every `other` point is matched by the literal test (None: no `other` points)."""
    out = []
    for n in sorted({p["n"] for p in points}):
        mine = [p for p in points if p["n"] == n and p["method"] == fast]
        theirs = sorted((p for p in points if p["n"] == n and p["method"] == other), key=lambda p: p["rel_error"])
        front, cells = pareto(mine), []
        for p in theirs:
            ok = [c for c in mine if c["rel_error"] <= p["rel_error"]]
            best = max(ok, key=lambda c: c["speedup_vs_cudnn"]) if ok else None
            cells.append({"other_knobs": p["knobs"], "other_error": p["rel_error"], "other_speedup": p["speedup_vs_cudnn"],
                          "best_knobs": best and best["knobs"], "best_error": best and best["rel_error"],
                          "best_speedup": best and best["speedup_vs_cudnn"],
                          "faster": bool(best and best["speedup_vs_cudnn"] >= p["speedup_vs_cudnn"]),
                          "speedup_at_equal_error": speedup_at(front, p["rel_error"])})
        out.append({"n": n, "fast": fast, "other": other, "points": cells,
                    "dominates": all(c["faster"] for c in cells) if cells else None})
    return out


def best_within(points: list[dict], max_error: float) -> list[dict]:
    """Per length and method: the fastest point whose error is ≤ max_error (None when no point reaches it)."""
    out = []
    for n, method in sorted({(p["n"], p["method"]) for p in points}):
        ok = [p for p in points if p["n"] == n and p["method"] == method and p["rel_error"] <= max_error]
        best = max(ok, key=lambda p: p["speedup_vs_cudnn"]) if ok else None
        out.append({"n": n, "method": method, "max_error": max_error, "knobs": best and best["knobs"],
                    "speedup_vs_cudnn": best and best["speedup_vs_cudnn"], "density": best and best["density"],
                    "rel_error": best and best["rel_error"]})
    return out


def write_results(points, out_dir="bench/results/latest/frontier", max_error=0.02, plots=True) -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "frontier_latest.json")
    with open(path, "w") as f:
        json.dump({"points": points, "compare": compare(points), "best_within": best_within(points, max_error)},
                  f, indent=1)
    if plots and points:
        plot(points, os.path.join(out_dir, "frontier.png"), max_error)
    return path


def show(v) -> str:
    """A knob value as users type it: 1048576 → '1M', 16384 → '16k', 0.9 → '0.9', 'floor' → 'floor'."""
    for unit, size in (("M", 1 << 20), ("k", 1 << 10)):
        if isinstance(v, int) and v >= size and v % size == 0:
            return f"{v // size}{unit}"
    return f"{v:g}" if isinstance(v, float) else str(v)


def knob_label(knobs: dict) -> str:
    """{'max_budget': 1048576, 'gamma': 0.9} → 'max_budget=1M gamma=0.9'."""
    return " ".join(f"{k}={show(v)}" for k, v in knobs.items())


def plot(points, path, max_error=0.02):
    """One panel per length: speedup vs cuDNN against rel. error, every point, a line per method's Pareto front;
    in grey the Pareto front of CRISP's points at the same-budget oracle's error (spread query blocks)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    lengths = sorted({p["n"] for p in points})
    fig, axes = plt.subplots(1, len(lengths), figsize=(4.5 * len(lengths), 4), squeeze=False)
    for ax, n in zip(axes[0], lengths):
        for method in sorted({p["method"] for p in points}):
            pts = [p for p in points if p["n"] == n and p["method"] == method]
            if not pts:
                continue
            front = pareto(pts)
            line, = ax.plot([p["rel_error"] for p in front], [p["speedup_vs_cudnn"] for p in front], label=method)
            ax.scatter([p["rel_error"] for p in pts], [p["speedup_vs_cudnn"] for p in pts], color=line.get_color(), s=14)
            for p in pts:
                ax.annotate(knob_label(p["knobs"]), (p["rel_error"], p["speedup_vs_cudnn"]), fontsize=5)
        mine = [p for p in points if p["n"] == n and p["method"] == "crisp" and p.get("oracle_error") is not None]
        pts = pareto([{**p, "rel_error": p["oracle_error"]} for p in mine])
        if pts:
            ax.plot([p["rel_error"] for p in pts], [p["speedup_vs_cudnn"] for p in pts], ls="--", color="grey",
                    marker=".", lw=1, label="same-budget oracle")
        ax.axvline(max_error, color="grey", ls="--", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda x, _: f"{100 * x:g} %"))
        ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda y, _: f"{y:g}×"))
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_minor_formatter(ticker.NullFormatter())
        ax.set_title(f"n = {show(n)}")
        ax.set_xlabel("output rel. error vs dense")
        ax.set_ylabel("speedup vs cuDNN")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
