"""Merge one GPU run's results and print the short table (scripts/device/gpu_bench.sh's last step).

    python -m crisp_trt.bench.summary WORK [OUT] [--tar]      # OUT: bench/results/latest

WORK holds each step's directory (op_latest.json, accuracy_latest.json, e2e.json, PNGs, logs). OUT gets
bench/results/latest's layout: op/ (the merged op_latest.json and its plots, rows in step order), accuracy/
and e2e/ (the JSON and plots copied as they are), summary.txt, and with --tar results.tar.gz of everything in
WORK (for a caller limited to a few files; not for the working tree).
The table: per op row of the sparse methods n, workload, ms, speed-up vs cuDNN, density, error,
recall, routing share; per accuracy method and length the mean accuracy and the worst cell against
dense; perplexity; e2e TTFT and text identity.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import sys
import tarfile

from . import op


def _load(path):
    with open(path) as f:
        return json.load(f)


def merge(work: str, out: str, tar: bool = True) -> dict:
    os.makedirs(out, exist_ok=True)
    found = {}
    rows = [r for p in sorted(glob.glob(os.path.join(work, "*", "op_latest.json"))) for r in _load(p)["rows"]]
    if rows:
        op.write_results(rows, os.path.join(out, "op"))
        found["op"] = rows
    for name, key in (("accuracy_latest.json", "accuracy"), ("e2e.json", "e2e")):
        hits = sorted(glob.glob(os.path.join(work, "*", name)))
        if hits:
            os.makedirs(os.path.join(out, key), exist_ok=True)
            shutil.copy(hits[-1], os.path.join(out, key, name))
            found[key] = _load(hits[-1])
            for png in glob.glob(os.path.join(os.path.dirname(hits[-1]), f"{key}*.png")):
                shutil.copy(png, os.path.join(out, key))
    if tar:
        with tarfile.open(os.path.join(out, "results.tar.gz"), "w:gz") as archive:
            archive.add(work, arcname="results")
    return found


def _f(x, fmt):
    return "-" if x is None else format(x, fmt)


def table(found: dict) -> str:
    lines = []
    rows = [r for r in found.get("op", []) if r["method"] in op.SPARSE]
    if rows:
        lines.append(f"{'workload':<26}{'n':>8} {'method':<12}{'ms':>9}{'x cuDNN':>9}{'density':>9}{'err':>9}"
                     f"{'recall':>8}{'route%':>8}")
        for r in rows:
            share = None if r["routing_share"] is None else 100 * r["routing_share"]
            lines.append(f"{r['workload']:<26}{r['n']:>8} {r['method']:<12}{_f(r['ms'], '9.2f')}"
                         f"{_f(r['speedup_vs_cudnn'], '9.2f')}{_f(r['density'], '9.3f')}{_f(r['rel_error'], '9.4f')}"
                         f"{_f(r['recall'], '8.4f')}{_f(share, '8.1f')}")
    acc = found.get("accuracy")
    if acc:
        cells = acc["cells"]
        dense = {(c["n"], c["depth"]): c["accuracy"] for c in cells if c["method"] == "dense"}
        for m in sorted({c["method"] for c in cells}):
            for n in sorted({c["n"] for c in cells}):
                mine = [c for c in cells if c["method"] == m and c["n"] == n]
                worst = min(c["accuracy"] - dense.get((n, c["depth"]), 0.0) for c in mine)
                mean = sum(c["accuracy"] for c in mine) / len(mine)
                flips = (f"  lost/gained trials {sum(c.get('lost', 0) for c in mine)}/"
                         f"{sum(c.get('gained', 0) for c in mine)}")
                lines.append(f"accuracy {m:<12} n={n:<6} mean {mean:.3f}  worst cell vs dense {worst:+.3f}{flips}")
        for p in acc.get("perplexity", []):
            lines.append(f"perplexity {p['method']:<12} n={p['n']:<6} {p['perplexity']:.4f}")
    for r in (found.get("e2e") or {}).get("rows", []):
        lines.append(f"e2e n={r['length']:<6} TTFT dense {r['ttft_dense_ms']:.1f} ms  crisp {r['ttft_crisp_ms']:.1f} ms  "
                     f"x{r['speedup']:.2f}  identical {r['identical_to_dense']}/{r['trials']}"
                     + (f" (eager-dense control {r['identical_control']}/{r['trials']})" if "identical_control" in r else ""))
    return "\n".join(lines) or "no results"


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    tar = "--tar" in args
    paths = [a for a in args if a != "--tar"]
    work, out = paths[0], paths[1] if len(paths) > 1 else "bench/results/latest"
    text = table(merge(work, out, tar=tar))
    with open(os.path.join(out, "summary.txt"), "w") as f:
        f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
