"""Real long context on the GPU machine: Qwen2.5-Coder-0.5B at 16k–128k (YaRN above 32k: ×2 at 64k, ×4 at 128k), one step a call.

    bash scripts/device/unstage.sh qwen && python3 scripts/device/qwen_long.py STEP [STEP ...] [--lengths ...]

Steps (each writes $OUT/<step>.json and prints a short table last):
  prep   the staged GGUF (unstage.sh) → bf16 HF checkpoint in /tmp/qwen_hf (later steps load that: seconds)
  op     every layer's captured Q/K/V on the evaluation corpora: cuDNN vs CRISP vs FlexPrefill-mode, per
         layer and summed (density, error, recall, same-budget oracle) — crisp_trt.bench.op.run_real_model
  tune   candidate defaults on the calibration corpora: whole-model TTFT, perplexity, KL to dense; the pick
         (crisp_trt.bench.defaults.pick) is kept in /tmp/crisp_pick.json for the steps after it
  e2e    whole-model TTFT dense vs CRISP (and the pick, FlexPrefill-mode) on the code corpus
  stats  the synthetic generator's statistics (workloads.fit.stats_of, all 24 layers) of the calibration corpora:
         2k–32k from one 32k capture, 64k and 128k (YaRN ×2 / ×4, recorded under "rope") from their own →
         stats.json, which `python -m crisp_trt.workloads.fit --capture stats.json --corpus code_calib
         --lengths 2048,4096,8192,16384,32768 --out ...` refits and checks on any machine
  acc    passkey and multikey retrieval (paired, 4 depths) + perplexity at --ppl-length (docs corpus)
  oracle the block oracle inside the model (crisp_trt.bench.oracle) on the calibration corpora: perplexity, KL
         to dense and density at each --coverages (1.0: fp32 attention over every block, the precision control),
         and at the block counts of each --oracle-budgets config, beside CRISP under those configs: how sparse any
         block selection could be at the model's accuracy bar (≈ 80 s a 128k forward on an H100: few coverages
         there); --estimates: the same coverages ranked by a cheap estimate of the mass (what a selector affords)
  plot   qwen_speed.png from op.json and e2e.json in $OUT (no GPU, no model: runs anywhere)
Needs CRISP_TRT_TEXTS (crisp_trt.workloads.texts.export) and gguf importable (for prep).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from crisp_trt.bench.estimators import parse as parse_estimate  # noqa: E402
from crisp_trt.config import CrispConfig  # noqa: E402
from crisp_trt.lengths import parse_length  # noqa: E402
from crisp_trt.models import as_plain_weights, load_model, rope_for  # noqa: E402

HF_DIR = Path("/tmp/qwen_hf")
PICK = Path("/tmp/crisp_pick.json")
CANDIDATES = {  # fixed before a run; chosen between on calibration text only. Spike is explicit in each entry, so
    # a name keeps meaning the config it measured when the default changes (since session 17: coverage 0.99 + spike 0.01).
    # Session 18's set: sparser configs, each with the spike stage (session 17's tune: without it every sparser
    # candidate had 2–4× the default's KL; with it the KL at 128k halved), and the spike threshold either side.
    "default": CrispConfig(),
    "cov0.999_nospike": CrispConfig(coverage=0.999, spike=0.0),  # the default before session 17, for reference
    **{f"cov{c}_spike0.01": CrispConfig(coverage=c, spike=0.01) for c in (0.98, 0.95, 0.9)},
    **{f"cov{c}_b8k_spike0.01": CrispConfig(coverage=c, max_budget=8192, spike=0.01) for c in (0.99, 0.95)},
    **{f"cov0.99_spike{t}": CrispConfig(coverage=0.99, spike=t) for t in (0.005, 0.02)},
    # Session 22: every head block-sparse, ranked by 16 sampled rows' exact attention, until gamma of it (the
    # block oracle at coverage 0.95 kept the 8k answers at density 0.33; at 8k, 16 rows came within 1.4× (0.95) /
    # 2.1× (0.98) of its per-layer error)
    **{f"rows16_g{g}": CrispConfig.sampled_rows(gamma=g) for g in (0.95, 0.97, 0.98, 0.99)},  # 0.97: between 0.95 (KL 0.014 at 16k docs) and 0.98; 0.99: for 128k,
    # where 16 rows keep fewer blocks than the oracle at the same gamma (0.156 vs 0.172 density, 4× its KL)
    # With a 128k-token row cap instead of 16k: at 128k every rows16 gamma had KL ≈ 0.11 (0.97 → 0.99: −7 %)
    "default_b128k": CrispConfig(max_budget=131072),
    **{f"rows16_g{g}_b128k": CrispConfig.sampled_rows(gamma=g, max_budget=131072) for g in (0.97, 0.98, 0.99)},
    # 0.98 (session 27): between 0.97 (128k KL 0.055 / 0.027, over the default's 0.077 / 0.020 on code) and 0.99
    # (0.022 / 0.010, TTFT 1.76× against the default's 1.97×), the candidate the pick rule could take for every length
    # Session 27: with the spike stage, rows16_g0.98 kept all 50 of SmolLM2's 2k word-retrieval trials (KL ≤ 1e-4),
    # where without it it lost 4 (one cell's KL 0.37): the sampled rows miss a far block only a few rows need
    **{f"rows16_g{g}_spike0.01{b}": CrispConfig.sampled_rows(gamma=g, spike=0.01, max_budget=cap)
       for g in (0.97, 0.98) for b, cap in (("", 16384), ("_b128k", 131072))},
}


def out_dir() -> Path:
    out = Path(os.environ.get("OUT", "bench/results/latest/qwen"))
    out.mkdir(parents=True, exist_ok=True)
    return out


def save(name: str, data) -> None:
    (out_dir() / f"{name}.json").write_text(json.dumps(data, indent=1))


def picked(extra: list[str] | None = None) -> dict:
    """{"crisp_tuned": config} when the tune step picked a config other than the default, else {}; with
    `extra` (CANDIDATES names), {name: that config} for each as well."""
    more = {name: CANDIDATES[name] for name in extra or ()}
    if not PICK.is_file():
        return more
    pick = json.loads(PICK.read_text())
    cfg = pick.get("config")
    tuned = {"crisp_tuned": CrispConfig.from_dict(cfg)} if cfg and CrispConfig.from_dict(cfg) != CrispConfig() else {}
    return {**tuned, **more}


def model(args):
    """The bf16 checkpoint prep wrote, on the GPU; with --device cpu the bundled GGUF in fp32
    (crisp_trt.models.qwen_path: the `qwen` extra), for a first look on any machine (an 8k forward takes minutes)."""
    if args.device == "cpu":
        from crisp_trt.models import qwen_path

        return load_model(qwen_path(), attn_implementation="sdpa", dtype=torch.float32, device="cpu")
    if not HF_DIR.is_dir():
        raise SystemExit("no /tmp/qwen_hf: run the prep step first (the machine keeps /tmp only while warm)")
    return load_model(HF_DIR, attn_implementation="sdpa", dtype=torch.bfloat16, device="cuda")


def step_prep(args):
    gguf = next(Path("/tmp/crisp_stage/qwen").glob("*.gguf"), None)
    if gguf is None:
        raise SystemExit("prep: no staged GGUF in /tmp/crisp_stage/qwen (scripts/device/unstage.sh qwen)")
    t = time.time()
    mdl, tok = load_model(gguf, attn_implementation="sdpa", dtype=torch.bfloat16, logits32=False)
    as_plain_weights(mdl).save_pretrained(HF_DIR)
    tok.save_pretrained(HF_DIR)
    print(f"prep: {gguf.name} → {HF_DIR} in {time.time() - t:.0f} s")
    save("prep", {"gguf": gguf.name, "seconds": time.time() - t, "gpu": torch.cuda.get_device_name()})


def step_op(args):
    from crisp_trt.bench.op import run_real_model

    mdl, tok = model(args)
    rows = []
    for source, lengths in (("code", args.lengths), ("docs", args.docs_lengths)):
        rows += run_real_model(mdl, tok, lengths, sources=(source,), configs=picked(args.extra), rope=rope_for(mdl),
                               repeats=args.repeats, model_name="qwen", on_rows=lambda r: save("op", {"rows": rows + r}))
        save("op", {"rows": rows})
    print(f"{'workload':<14}{'n':>8} {'method':<12}{'ms':>9}{'x cuDNN':>9}{'density':>9}{'error':>8}"
          f"{'oracle':>8}{'recall':>8}")
    for r in rows:
        if r["workload"].endswith("_all"):
            print(f"{r['workload']:<14}{r['n']:>8} {r['method']:<12}{r['ms']:>9.1f}{r['speedup_vs_cudnn'] or 0:>9.2f}"
                  f"{r['density']:>9.3f}{r['rel_error']:>8.4f}{r['oracle_error'] or 0:>8.4f}{r['recall']:>8.3f}")


def step_tune(args):
    from crisp_trt.bench import defaults

    mdl, tok = model(args)
    candidates = {name: CANDIDATES[name] for name in args.candidates or CANDIDATES}
    rows = defaults.sweep(mdl, tok, candidates, args.tune_lengths, rope=rope_for(mdl))
    pick = defaults.pick(rows)
    pick["config"] = CANDIDATES[pick["name"]].to_dict() if pick["name"] else None
    PICK.write_text(json.dumps(pick))
    save("tune", {"rows": rows, "pick": pick})
    print(f"{'n':>7} {'source':<11}{'method':<13}{'ttft ms':>9}{'x dense':>8}{'dppl %':>8}{'kl':>9}")
    for r in rows:  # TTFT is timed on the first source only (defaults.sweep): "-" on the others
        timed = f"{r['ttft_ms']:>9.1f}{r['speedup']:>8.2f}" if r["ttft_ms"] else f"{'-':>9}{'-':>8}"
        print(f"{r['n']:>7} {r['source']:<11}{r['method']:<13}{timed}{100 * r['dppl']:>8.3f}{r['kl']:>9.5f}")
    print("pick:", pick["name"], json.dumps(pick["candidates"].get(pick["name"], {})))


def step_e2e(args):
    from crisp_trt.bench.accuracy import GRAPHS
    from crisp_trt.bench.e2e import run_ttft

    mdl, tok = model(args)
    configs = picked(args.extra)
    methods = ("dense", "crisp", *configs, "flexprefill")
    methods += tuple(m + GRAPHS for m in ("crisp", *configs)) if args.graphs else ()
    rows = run_ttft(mdl, tok, args.lengths, methods, configs, rope=rope_for(mdl), repeats=args.repeats)
    save("e2e", {"rows": rows, "configs": {k: c.to_dict() for k, c in configs.items()}})
    for r in rows:
        print(f"n={r['length']:>7} " + " ".join(f"{m} {r[f'ttft_{m}_ms']:.0f} ms ({r[f'speedup_{m}']:.2f}x)" for m in methods))


def step_stats(args):
    from crisp_trt.models import set_rope_scaling
    from crisp_trt.workloads.fit import stats_of
    from crisp_trt.workloads.real import capture, text_ids

    mdl, tok = model(args)
    rope = rope_for(mdl)
    result = {"model": "Qwen2.5-Coder-0.5B-Instruct bf16", "gpu": torch.cuda.get_device_name(), "stats": {}, "rope": {}}
    for source in ("code_calib", "docs_calib"):
        for n, lengths in ((32768, (2048, 4096, 8192, 16384, 32768)), (65536, (65536,)), (131072, (131072,))):
            result["rope"][str(n)] = rope(n)  # YaRN's attention factor also scales the logits: not only length
            set_rope_scaling(mdl, result["rope"][str(n)])
            got = stats_of(capture(mdl, text_ids(tok, n, source=source), out_device="cuda", dtype=torch.bfloat16),
                           lengths)
            result["stats"].setdefault(source, {}).update({str(m): s for m, s in got.items()})
            save("stats", result)
    set_rope_scaling(mdl, None)
    print(f"{'source':<11}{'n':>8} " + " ".join(f"{k:>10}" for k in ("sink", "local", "top", "background", "floor")))
    for source, rows in result["stats"].items():
        for n, s in rows.items():
            print(f"{source:<11}{n:>8} " + " ".join(f"{s[k]:>10.3f}" for k in (
                "sink_share", "local_share", "top_share", "background_share", "floor")))


def step_acc(args):
    from crisp_trt.bench.accuracy import run_accuracy

    mdl, tok = model(args)
    configs = picked(args.extra)
    methods = tuple(m for m in ("dense", "crisp", *configs, "flexprefill") if m not in args.skip)
    deadline = time.time() + args.budget_s
    result = {"cells": [], "perplexity": [], "skipped": [], "configs": {k: c.to_dict() for k, c in configs.items()}}
    for n in args.lengths:
        for task in args.tasks.split(","):
            if time.time() > deadline:
                result["skipped"].append({"n": n, "task": task, "why": "time budget"})
                continue
            res = run_accuracy(lengths=(n,), depths=(0.0, 1 / 3, 2 / 3, 1.0), trials=args.trials, methods=methods,
                               model=mdl, tok=tok, task=task, haystack="code", configs=configs, rope=rope_for(mdl),
                               perplexity=args.ppl and task == "passkey" and n == args.ppl_length,
                               perplexity_text="docs")
            result["cells"] += [{**c, "task": task} for c in res["cells"]]
            result["perplexity"] += res["perplexity"]
            save(f"acc_{args.tag}", result)
    for task in ("passkey", "multikey"):
        for n in args.lengths:
            cells = [c for c in result["cells"] if c["task"] == task and c["n"] == n]
            if cells:
                print(f"{task:<9}{n:>7} " + "  ".join(
                    f"{m} {sum(c['accuracy'] for c in cells if c['method'] == m) / 4:.3f}"
                    f" (-{sum(c['lost'] for c in cells if c['method'] == m)}/+{sum(c['gained'] for c in cells if c['method'] == m)})"
                    for m in methods))
    for p in result["perplexity"]:
        print(f"perplexity n={p['n']} {p['method']}: {p['perplexity']:.4f}")


def step_oracle(args):
    from crisp_trt.bench.oracle import BlockOracle, model_sweep

    mdl, tok = model(args)
    rows, gpu = [], torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    for n in args.oracle_lengths:  # saved after every row: a cut-off run keeps what it finished
        sources = args.oracle_sources or (("docs_calib",) if n > 32768 else ("docs_calib", "code_calib"))
        oracles = {f"oracle_cov{c}": BlockOracle(coverage=c) for c in args.coverages}
        oracles.update({f"{e}_cov{c}": BlockOracle(coverage=c, estimate=e)
                        for e in args.estimates for c in args.coverages if c < 1.0})
        oracles.update({f"oracle_at_{name}": BlockOracle(budget=CANDIDATES[name]) for name in args.oracle_budgets})
        done = list(rows)
        rows = done + model_sweep(mdl, tok, oracles, {name: CANDIDATES[name] for name in args.oracle_budgets}, [n],
                                  sources=sources, rope=rope_for(mdl),
                                  on_row=lambda r: save("oracle", {"rows": done + r, "gpu": gpu}))
    print("oracle_at_X: as many blocks as CRISP's plan under X lists, on the oracle model's own activations")
    print(f"{'n':>7} {'source':<11}{'method':<34}{'density':>8}{'dppl %':>8}{'kl':>9}")
    for r in rows:
        dens = "" if r.get("density") is None else f"{r['density']:.3f}"
        print(f"{r['n']:>7} {r['source']:<11}{r['method']:<34}{dens:>8}{100 * r['dppl']:>8.3f}{r['kl']:>9.5f}")


def step_plot(args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    op = json.loads((out_dir() / "op.json").read_text())["rows"]
    e2e = json.loads((out_dir() / "e2e.json").read_text())["rows"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    methods = list(dict.fromkeys(r["method"] for r in op if not r["method"].startswith("dense")))
    for wl in sorted({r["workload"] for r in op if r["workload"].endswith("_all")}):
        for m in methods:
            pts = sorted((r["n"], r["speedup_vs_cudnn"]) for r in op if r["workload"] == wl and r["method"] == m)
            ax1.plot(*zip(*pts), marker="o", label=f"{m}, {wl.split('_')[1]} text")
    for m in (m for m in methods if f"speedup_{m}" in e2e[0]):
        ax2.plot([r["length"] for r in e2e], [r[f"speedup_{m}"] for r in e2e], marker="o", label=m)
    for ax, title in ((ax1, "attention, 24 layers summed (× cuDNN)"), (ax2, "whole-model TTFT (× dense)")):
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("prompt tokens")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(f"Qwen2.5-Coder-0.5B: crisp = the default CrispConfig, crisp_tuned = the tune step's pick, others "
                 f"named configs, {op[0]['gpu']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out_dir() / "qwen_speed.png", dpi=120)
    print(out_dir() / "qwen_speed.png")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("steps", nargs="+", choices=("prep", "op", "tune", "e2e", "stats", "acc", "oracle", "plot"))
    lengths = lambda s: [parse_length(x) for x in s.split(",")]  # noqa: E731
    p.add_argument("--lengths", type=lengths, default=lengths("16k,32k,64k,128k"))
    p.add_argument("--docs-lengths", type=lengths, default=lengths("32k,128k"), help="op: lengths on the docs corpus")
    p.add_argument("--tune-lengths", type=lengths, default=lengths("16k,32k,128k"))
    p.add_argument("--oracle-lengths", type=lengths, default=lengths("32k,128k"),
                   help="oracle: lengths (both calibration corpora up to 32k, docs_calib above)")
    p.add_argument("--coverages", type=lambda s: [float(x) for x in s.split(",")], default=[0.8, 0.9, 0.95, 0.98, 1.0],
                   help="oracle: coverage budgets, comma-separated fractions (1.0: the fp32 control)")
    names = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    p.add_argument("--candidates", type=names, default=None,
                   help="tune: CANDIDATES names to sweep (default: all; the default config always among them)")
    p.add_argument("--oracle-budgets", type=names, default=["default", "cov0.9_spike0.01", "cov0.99_b8k_spike0.01"],
                   help="oracle: CANDIDATES names; the oracle at each one's block counts, and CRISP under it")
    p.add_argument("--estimates", type=names, default=[],
                   help="oracle: also select by these cheap estimates of the mass at each coverage below 1 "
                        "(crisp_trt.bench.estimators: rowsS, antidiagS), scored beside the oracle")
    p.add_argument("--oracle-sources", type=names, default=None,
                   help="oracle: calibration corpora (default: docs_calib and code_calib up to 32k, docs_calib above)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="where the model runs (cpu: the bundled GGUF in fp32, for the oracle's first look)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--skip", default="", help="acc: methods to leave out, comma-separated")
    p.add_argument("--no-ppl", dest="ppl", action="store_false")
    p.add_argument("--ppl-length", type=parse_length, default=32768, help="acc: perplexity at this length")
    p.add_argument("--extra", choices=tuple(CANDIDATES), action="append", default=None,
                   help="op, e2e, acc: one more CRISP config to measure (repeat it for several)")
    p.add_argument("--tasks", default="passkey,multikey", help="acc: tasks, comma-separated")
    p.add_argument("--graphs", action="store_true",
                   help="e2e: every CRISP method also replayed from CUDA graphs (crisp_trt.graphs), as <name>_graphs")
    p.add_argument("--budget-s", type=float, default=520.0, help="acc: start no (length, task) after this")
    p.add_argument("--tag", default="main", help="acc: JSON name suffix")
    args = p.parse_args(argv)
    args.skip = set(filter(None, args.skip.split(",")))
    for option, chosen in (("--oracle-budgets", args.oracle_budgets), ("--candidates", args.candidates or [])):
        unknown = [b for b in chosen if b not in CANDIDATES]
        if unknown:
            p.error(f"{option} {','.join(unknown)}: expected names of {', '.join(CANDIDATES)}")
    if args.candidates and "default" not in args.candidates:
        args.candidates.insert(0, "default")
    for e in args.estimates:
        try:
            parse_estimate(e, CrispConfig().block_size)
        except ValueError as err:
            p.error(f"--estimates: {err}")
    for step in args.steps:
        t = time.time()
        globals()[f"step_{step}"](args)
        print(f"== {step}: {time.time() - t:.0f} s", flush=True)


if __name__ == "__main__":
    main()
