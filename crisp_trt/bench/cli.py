"""crisp-bench: op speed/accuracy, speed-vs-error frontiers, real-model accuracy, end-to-end, the e2e config sweep
(docs/design.md, "Benchmarks"). Each subcommand writes its JSON and plots to its own folder of
bench/results/latest/ (op/, frontier/, accuracy/, e2e/) unless --out says otherwise."""
from __future__ import annotations

import argparse
import sys

from ..workloads.texts import CORPORA
from .accuracy import KNOWN as ACCURACY_METHODS
from .accuracy import TASKS


def _lens(s: str):
    from ..lengths import parse_length

    return tuple(parse_length(x) for x in s.split(",") if x)


def _config(args):
    from ..config import CrispConfig

    if not args.config:
        return CrispConfig()
    import json

    text = args.config
    if not text.lstrip().startswith("{"):
        try:
            with open(text) as f:
                text = f.read()
        except OSError as e:
            raise SystemExit(f"--config {args.config!r}: cannot read it ({e.strerror}); expected a JSON file or an "
                             "inline JSON object of CrispConfig fields")
    try:
        fields = json.loads(text)
    except json.JSONDecodeError as e:
        raise SystemExit(f"--config: not JSON ({e}); expected an object of CrispConfig fields, e.g. "
                         '\'{"gamma": 0.98}\'')
    if not isinstance(fields, dict):
        raise SystemExit(f"--config: a JSON {type(fields).__name__}; expected an object of CrispConfig fields")
    try:
        return CrispConfig.from_dict(fields)
    except (TypeError, ValueError) as e:
        raise SystemExit(f"--config: {e}")


def _bar(total, desc):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, file=sys.stderr)


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected a comma list of layer indices or 'all'") from None


def cmd_op(args):
    import torch

    from . import op

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    lengths, shapes = _lens(args.lengths), tuple(args.shapes.split(","))
    methods, workloads = tuple(args.methods.split(",")), tuple(args.workloads.split(","))
    spec = None
    if args.spec:
        import json

        from ..workloads.synthetic import SyntheticSpec

        with open(args.spec) as f:
            spec = SyntheticSpec(**json.load(f))
    layers = None if args.layers == "all" else _ints(args.layers, "--layers")
    synthetic = sum(w != "real" for w in workloads) * len(shapes) * len(methods)
    real = ("real" in workloads) * len(methods) * len(layers or ())
    with _bar(None if layers is None and "real" in workloads else len(lengths) * (synthetic + real), "op") as bar:
        rows = op.run_op(lengths=lengths, shapes=shapes, methods=methods, workloads=workloads, repeats=args.repeats,
                         device=device, base=_config(args), spec=spec, progress=bar, recall_max_n=args.recall_max_n,
                         model_path=args.model, on_rows=lambda done: op.write_results(done, args.out, plots=False),
                         real_source=args.source, real_layers=layers)
    path = op.write_results(rows, args.out, plots=not args.no_plots)
    for r in rows:
        print(f"{r['workload']:>22} n={r['n']:>8} {r['method']:>12} {r['ms']:10.3f} ms  x{r['speedup_vs_cudnn'] or 0:6.2f}"
              f"  dens {r['density']:.3f}  err {r['rel_error']:.4f}  recall {r['recall'] if r['recall'] is None else round(r['recall'], 4)}")
    print(path)


def cmd_frontier(args):
    import torch

    from . import frontier

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    lengths = _lens(args.lengths)
    sweeps = {"crisp": args.crisp, "flexprefill": args.flexprefill}
    with _bar(None, "frontier") as bar:  # run_frontier sets the total once it has planned the points
        points = frontier.run_frontier(lengths=lengths, shape=args.shape, workload=args.workload, sweeps=sweeps,
                                       repeats=args.repeats, device=device, base=_config(args), progress=bar,
                                       recall_max_n=args.recall_max_n,
                                       on_points=lambda done: frontier.write_results(done, args.out, args.max_error,
                                                                                     plots=False))
    path = frontier.write_results(points, args.out, max_error=args.max_error, plots=not args.no_plots)
    for p in points:
        print(f"n={p['n']:>8} {p['method']:>12} {frontier.knob_label(p['knobs']):<32} x{p['speedup_vs_cudnn']:6.2f}"
              f"  dens {p['density']:.3f}  err {p['rel_error']:.4f}  recall {p['recall'] if p['recall'] is None else round(p['recall'], 4)}")
    for c in frontier.compare(points):
        for x in c["points"]:
            eq = x["speedup_at_equal_error"]
            print(f"n={c['n']:>8} flexprefill {frontier.knob_label(x['other_knobs']):<26} err {x['other_error']:.4f} "
                  f"x{x['other_speedup']:5.2f} | crisp at equal error x{'  n/a' if eq is None else f'{eq:5.2f}'}")
        if c["dominates"] is not None:
            print(f"n={c['n']:>8} crisp at least as fast as every flexprefill point at no more error: {c['dominates']}")
    print(path)


def cmd_accuracy(args):
    from . import accuracy

    lengths, depths = _lens(args.lengths), tuple(float(x) for x in args.depths.split(","))
    methods = tuple(x for x in args.methods.split(",") if x)
    if args.no_retrieval and args.no_perplexity:
        raise ValueError("--no-retrieval with --no-perplexity leaves nothing to measure; drop one of them")
    if args.no_retrieval:
        depths = ()
    accuracy.check_arguments(lengths, depths, args.trials, methods, flag="--", task=args.task)
    total = len(lengths) * len(depths) * args.trials * len(set(methods) | {"dense"})
    with _bar(total, "accuracy") as bar:
        res = accuracy.run_accuracy(lengths=lengths, depths=depths, trials=args.trials, methods=methods,
                                    base=_config(args), device=args.device, progress=bar,
                                    perplexity=not args.no_perplexity, model_path=args.model, task=args.task,
                                    haystack=args.haystack, perplexity_text=args.perplexity_text, rope="auto")
    path = accuracy.write_results(res, args.out, plots=not args.no_plots)
    for c in res["cells"]:
        print(f"{c['method']:>12} n={c['n']:>6} depth={c['depth']:.2f} acc={c['accuracy']:.3f} "
              f"loglik={c['loglik']:.3f} kl={c['kl']:.5f}")
    for p in res["perplexity"]:
        print(f"{p['method']:>12} n={p['n']:>6} ppl={p['perplexity']:.4f}")
    print(path)


def cmd_e2e(args):
    from . import e2e

    return e2e.main_from_args(args)


def cmd_sweep(args):
    from . import sweep

    result = sweep.run_sweep(args.artifact, _lens(args.lengths), trials=args.trials, new_tokens=args.new_tokens,
                             variants=[x for x in args.variants.split(",") if x], device=args.device)
    path = sweep.write_results(result, args.out)
    print("\n" + sweep.table(result["rows"]))
    print(path)


RESULTS = "bench/results/latest"  # each subcommand's default --out is its folder here


def main(argv=None):
    from .frontier import SWEEPS

    p = argparse.ArgumentParser(prog="crisp-bench", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("op", help="attention op: dense (cuDNN/FA2) vs CRISP, FlexPrefill-mode, ablations")
    o.add_argument("--lengths", default="4k,8k,32k,128k", help="comma list, e.g. 4k,8k,128k,1M")
    o.add_argument("--shapes", default="llama3_8b,smollm2", help="llama3_8b (32/8, d=128), smollm2 (9/3, d=64)")
    o.add_argument("--methods", default="dense_cudnn,dense_fa2,crisp,flexprefill,crisp_gamma,crisp_jsd")
    o.add_argument("--workloads", default="synthetic",
                   help="synthetic (one spec fitted to SmolLM2's mean layer), synthetic_classes (a spec per class of "
                        "SmolLM2 layers, one per kv head), synthetic_plain (hand-set spec), real (a real model's Q/K/V: --model, --source, --layers; YaRN past its native context)")
    o.add_argument("--spec", help="JSON SyntheticSpec (e.g. from crisp_trt.workloads.fit)")
    o.add_argument("--repeats", type=int, default=5)
    o.add_argument("--recall-max-n", type=int, default=16384, help="longest n whose recall is measured")
    o.add_argument("--source", default="licenses", choices=("licenses", *CORPORA),
                   help="real workload: the text (licenses: Debian's licence texts; the others: "
                        "crisp_trt.workloads.texts corpora, 16k–128k tokens; default: %(default)s)")
    o.add_argument("--layers", default="0,15,29",
                   help="real workload: comma list of layers, or 'all' (each plus their sum; default: %(default)s)")
    o.set_defaults(fn=cmd_op)
    f = sub.add_parser("frontier", help="speedup-vs-error curves: CRISP and FlexPrefill-mode budget sweeps vs cuDNN",
                       description="Sweeps each method's budget knobs on one synthetic input per length and times every "
                                   "point against cuDNN in the same run; says per length whether CRISP is at least as "
                                   "fast as each FlexPrefill-mode point at no more error. JSON + PNG.")
    f.add_argument("--lengths", default="32k,128k", help="comma list, e.g. 32k,128k,512k")
    f.add_argument("--shape", default="llama3_8b", help="llama3_8b (32/8, d=128) or smollm2 (9/3, d=64)")
    f.add_argument("--workload", default="synthetic_classes", help="synthetic, synthetic_classes or synthetic_plain")
    f.add_argument("--crisp", default=SWEEPS["crisp"],
                   help="CRISP grid over CrispConfig knobs: knob=v1,v2;knob2=... (default: %(default)s)")
    f.add_argument("--flexprefill", default=SWEEPS["flexprefill"],
                   help="FlexPrefill-mode grid, same syntax; \"\" leaves a method out (default: %(default)s)")
    f.add_argument("--max-error", type=float, default=0.02, help="error bound of the best-point summary")
    f.add_argument("--repeats", type=int, default=5)
    f.add_argument("--recall-max-n", type=int, default=16384, help="longest n whose recall is measured on the CPU")
    f.set_defaults(fn=cmd_frontier)
    a = sub.add_parser("accuracy", help="real-model induction retrieval, log-likelihood, KL, perplexity",
                       description="Planted-word retrieval on real text with the real model, per length × needle depth "
                                   "cell, every method on the same prompts (fixed seeds), paired against dense; then "
                                   "perplexity on held-out text. bf16 on CUDA, fp32 on the CPU. JSON + heat maps.")
    a.add_argument("--lengths", default="2k,4k,8k",
                   help="comma list of prompt lengths in tokens, each ≥ 128 (default: %(default)s)")
    a.add_argument("--depths", default="0,0.25,0.5,0.75,1",
                   help="comma list of needle depths, fractions of the filler in [0, 1] (default: %(default)s)")
    a.add_argument("--trials", type=int, default=30, help="trials per length × depth cell (default: %(default)s)")
    a.add_argument("--methods", default="dense,crisp,flexprefill",
                   help=f"comma list of {', '.join(ACCURACY_METHODS)} (dense_eager: the dense-vs-dense control; "
                        "default: %(default)s)")
    a.add_argument("--task", default="words", choices=TASKS,
                   help="words: planted-word induction (SmolLM2); passkey / multikey: needle retrieval, chat-framed "
                        "(default: %(default)s)")
    a.add_argument("--haystack", default=None, choices=CORPORA,
                   help="text around the needles: a crisp_trt.workloads.texts corpus (default: the licence texts)")
    a.add_argument("--perplexity-text", default=None, choices=CORPORA,
                   help="perplexity text: a texts corpus (default: the licence texts' held-out tail)")
    a.add_argument("--no-perplexity", action="store_true", help="skip the held-out perplexity")
    a.add_argument("--no-retrieval", action="store_true", help="perplexity only: skip the retrieval cells")
    a.set_defaults(fn=cmd_accuracy)
    for s in (o, a):
        s.add_argument("--model", default=None, help="real model: GGUF file, HF directory or a bundled name: smollm2, qwen (default: smollm2)")
    for s, name in ((o, "op"), (a, "accuracy"), (f, "frontier")):
        s.add_argument("--device", default=None, help="torch device, e.g. cuda or cpu (default: cuda when present)")
        s.add_argument("--config", help="CrispConfig fields over the default, as a JSON file or an inline JSON "
                       "object, e.g. '{\"rows\": 16, \"gamma\": 0.98}' (CrispConfig.to_dict() names)")
        s.add_argument("--out", default=f"{RESULTS}/{name}",
                       help="folder of the JSON and PNG results (default: %(default)s)")
        s.add_argument("--no-plots", action="store_true", help="write the JSON only")
    from .e2e import add_arguments

    e = sub.add_parser("e2e", help="end-to-end TTFT dense vs CRISP on a crisp-build torch artifact",
                       description="TTFT and prefill tok/s vs prompt length, dense (SDPA) vs CRISP prefill, and "
                                   "greedy text identity to dense on planted-word retrieval prompts. JSON + PNG.")
    add_arguments(e)
    e.set_defaults(fn=cmd_e2e)
    from .sweep import VARIANTS

    w = sub.add_parser("sweep", help="which CRISP configs keep a torch artifact's greedy text identical to dense",
                       description="The e2e retrieval prompts through dense SDPA and through each config variant (and "
                                   "the eager-dense control): identical texts, retrieved, density, KL and the dense "
                                   "logit margin at each divergence, per length. JSON.")
    w.add_argument("artifact", help="a crisp-build --backend torch artifact folder")
    w.add_argument("--lengths", default="2k,4k,8k", help="comma list of prompt lengths (default: %(default)s)")
    w.add_argument("--trials", type=int, default=10, help="prompts per length (default: %(default)s)")
    w.add_argument("--new-tokens", type=int, default=6, help="greedy tokens per prompt (default: %(default)s)")
    w.add_argument("--variants", default=",".join(["eager", *VARIANTS]), help="comma list (default: %(default)s)")
    w.add_argument("--device", default=None, help="torch device (default: cuda when present)")
    w.add_argument("--out", default=f"{RESULTS}/e2e", help="folder of e2e_sweep.json (default: %(default)s)")
    w.set_defaults(fn=cmd_sweep)
    args = p.parse_args(argv)
    try:
        return args.fn(args)
    except ValueError as exc:  # a bad argument value (workload, sweep knob, length, config field): one line
        p.exit(2, f"crisp-bench {args.cmd}: error: {exc}\n")


if __name__ == "__main__":
    sys.exit(main())
