"""End-to-end latency of a crisp-build torch artifact: TTFT and prefill throughput vs prompt length,
dense (SDPA) vs CRISP prefill, same process, same prompts; plus whether the greedy continuation of a
planted-word retrieval prompt is identical to dense, per prompt with, where CRISP's tokens leave dense's,
the position and dense's top-2 logit gap there (a gap of a few hundredths is a near-tie that any second
dense kernel may flip too). The control measures exactly that in the same run: dense through HF's eager
kernels (same maths as SDPA, other rounding) against SDPA on the same prompts. JSON + PNG.

    from crisp_trt.bench.e2e import run_e2e
    run_e2e("artifact_dir", [2048, 4096, 8192], out_dir="bench/results/latest/e2e")
"""
from __future__ import annotations

import json
import random
import statistics
import time
from pathlib import Path

import torch

from ..config import CrispConfig

_WORDS = ("amber", "basalt", "cedar", "delta", "ember", "fjord", "garnet", "harbor", "indigo", "juniper",
          "kelp", "lantern", "marble", "nectar", "obsidian", "pepper", "quartz", "raven", "saffron", "tundra")
_FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ")


def retrieval_prompt_ids(tokenizer, length: int, trial: int, depth: float = 0.5):
    """Filler text of ~length tokens with 8 random words planted at `depth`; ends with their first 3.
    Returns (input ids [1, n], the 5 expected next words)."""
    rng = random.Random(1000 + trial)
    words = [rng.choice(_WORDS) for _ in range(8)]
    filler_ids = tokenizer(_FILLER * (length // 15 + 2)).input_ids
    needle = tokenizer(" Remember: " + " ".join(words) + ". ").input_ids
    tail = tokenizer(" Recall the words after 'Remember:' — " + " ".join(words[:3])).input_ids
    body = length - len(needle) - len(tail)
    cut = int(body * depth)
    ids = filler_ids[:cut] + needle + filler_ids[cut:body] + tail
    return torch.tensor([ids]), words[3:]


def greedy(model, ids: torch.Tensor, new_tokens: int, eos: int | None = None) -> tuple[list, list]:
    """Greedy token ids and each step's logits (float) from an HF model: the runtime's decoding
    (runtime.greedy_steps, which stops after eos), keeping the logits so that a divergence can be measured."""
    from ..runtime import greedy_steps

    steps = list(greedy_steps(model, ids, new_tokens, eos))
    return [t for t, _ in steps], [logits for _, logits in steps]


def divergence(dense: tuple, toks: list) -> dict | None:
    """Where greedy `toks` first leave dense's (`greedy`'s ids and logits) and dense's top-2 logit gap at
    that step; None when they agree on every step both took."""
    first = next((i for i, (a, b) in enumerate(zip(toks, dense[0])) if a != b), None)
    if first is None:
        return None
    top = dense[1][first].topk(2).values
    return {"diverge_at": first, "dense_gap": float(top[0] - top[1])}


def prefill_ms(model, ids: torch.Tensor, repeats: int = 3, warmup: int = 1) -> float:
    """Median ms of one prefill of ids [1, n] that returns the first token: the forward with a fresh KV cache
    and last-position logits, then the argmax (CUDA-synchronised wall time; the whole model, every layer).
    The benches' one TTFT timer (run_e2e times a runtime CrispModel's HF model with it)."""
    def once():
        with torch.no_grad():
            token = model(ids, use_cache=True, logits_to_keep=1).logits[0, -1].argmax()
        return int(token)  # the host read synchronises

    for _ in range(warmup):
        once()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        once()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def run_ttft(model, tok, lengths, methods=("dense", "crisp"), configs: dict | None = None, rope=None,
             source: str = "code", repeats: int = 3, base=None) -> list[dict]:
    """Whole-model TTFT per length: every method (accuracy's names: dense = SDPA, crisp, flexprefill, or a
    name in `configs`) on the same prompt of real text (a texts corpus), in the same process; rows with
    ttft_<method>_ms and speedup_<method> (dense's over the method's)."""
    from ..workloads.real import text_ids
    from .accuracy import use_method, use_rope

    base = base or CrispConfig()
    rows = []
    for n in lengths:
        use_rope(model, rope, n)
        ids = text_ids(tok, n, source=source).to(model.device)
        row = {"length": n, "source": source}
        for m in methods:
            use_method(model, m, base, configs)
            row[f"ttft_{m}_ms"] = prefill_ms(model, ids, repeats)
        for m in methods:
            row[f"speedup_{m}"] = row["ttft_dense_ms"] / row[f"ttft_{m}_ms"] if "dense" in methods else None
        use_method(model, "dense", base)
        rows.append(row)
    return rows


def run_e2e(artifact_dir, lengths=(2048, 4096, 8192), out_dir: str | Path = "bench/results/latest/e2e", repeats: int = 5,
            warmup: int = 1, trials: int = 10, new_tokens: int = 6, device: str | None = None, plot: bool = True,
            control: bool = True) -> dict:
    """TTFT dense vs CRISP per length (median of `repeats` after `warmup`), prefill tokens/s, and text
    identity to dense on `trials` retrieval prompts per length (row["prompts"]: per prompt identical,
    retrieved_dense / retrieved_crisp, and diverge_at / dense_gap where the tokens differ; with `control`,
    identical_control: HF eager dense against SDPA dense). Writes e2e.json (+ e2e.png)."""
    from crisp_trt import runtime

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device == "cuda" else None
    model = runtime.load(artifact_dir, device=device, dtype=dtype)
    rows = []
    for n in lengths:
        ids, _ = retrieval_prompt_ids(model.tokenizer, n, 0)
        ids = ids.to(model.device)
        row = {"length": int(ids.shape[1])}
        for att in ("dense", "crisp"):
            model.set_attention(att)
            row[f"ttft_{att}_ms"] = prefill_ms(model.model, ids, repeats, warmup)
            row[f"prefill_tok_s_{att}"] = row["length"] / (row[f"ttft_{att}_ms"] / 1000)
        row["speedup"] = row["ttft_dense_ms"] / row["ttft_crisp_ms"]
        prompts = []
        for t in range(trials):
            tids, expected = retrieval_prompt_ids(model.tokenizer, n, t, depth=(t + 0.5) / trials)
            tids = tids.to(model.device)
            runs, text = {}, {}
            for att in ("dense", "crisp"):
                model.set_attention(att)
                runs[att] = greedy(model.model, tids, new_tokens, model.tokenizer.eos_token_id)
                text[att] = model.tokenizer.decode(runs[att][0], skip_special_tokens=True)
            record = {"trial": t, "identical": text["dense"] == text["crisp"],
                      **{f"retrieved_{att}": all(w in text[att] for w in expected[:2]) for att in text},
                      **(divergence(runs["dense"], runs["crisp"][0]) or {})}
            if control:
                model.set_attention("eager")
                eager = greedy(model.model, tids, new_tokens, model.tokenizer.eos_token_id)[0]
                record["identical_control"] = model.tokenizer.decode(eager, skip_special_tokens=True) == text["dense"]
            prompts.append(record)
        if control:
            row["identical_control"] = sum(p["identical_control"] for p in prompts)
        row.update({"identical_to_dense": sum(p["identical"] for p in prompts), "trials": trials,
                    "retrieved_dense": sum(p["retrieved_dense"] for p in prompts),
                    "retrieved_crisp": sum(p["retrieved_crisp"] for p in prompts), "prompts": prompts})
        rows.append(row)
    result = {"artifact": str(artifact_dir), "device": device,
              "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
              "dtype": str(dtype or next(model.model.parameters()).dtype), "repeats": repeats,
              "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": rows}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "e2e.json").write_text(json.dumps(result, indent=2))
    if plot:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt

            fig, ax = plt.subplots(figsize=(6, 4))
            xs = [r["length"] for r in rows]
            ax.plot(xs, [r["ttft_dense_ms"] for r in rows], "o-", label="dense (SDPA)")
            ax.plot(xs, [r["ttft_crisp_ms"] for r in rows], "s-", label="CRISP prefill")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("prompt tokens")
            ax.set_ylabel("TTFT (ms)")
            ax.set_title(f"TTFT, {result['device_name']}")
            ax.legend()
            fig.tight_layout()
            fig.savefig(out / "e2e.png", dpi=120)
            plt.close(fig)
        except ImportError:
            pass
    return result


def add_arguments(p) -> None:
    """The e2e options, shared by `crisp-bench e2e` and `python -m crisp_trt.bench.e2e`."""
    p.add_argument("artifact", metavar="DIR", help="crisp-build --backend torch output directory")
    p.add_argument("--lengths", default="2k,4k,8k", help="prompt lengths, e.g. 2k,4k,8k")
    p.add_argument("--out", default="bench/results/latest/e2e", help="directory for e2e.json and e2e.png")
    p.add_argument("--repeats", type=int, default=5, help="timed prefills per length and attention (median)")
    p.add_argument("--trials", type=int, default=10, help="retrieval prompts per length for the identity check")
    p.add_argument("--device", default=None, help="cuda / cpu (default: cuda when available)")
    p.add_argument("--no-control", dest="control", action="store_false",
                   help="skip the eager-dense control (HF eager vs SDPA identity on the same prompts)")


def main_from_args(args) -> int:
    from ..lengths import parse_length

    res = run_e2e(args.artifact, [parse_length(x) for x in args.lengths.split(",")], args.out, args.repeats,
                  trials=args.trials, device=args.device, control=args.control)
    for r in res["rows"]:
        print(json.dumps({k: v for k, v in r.items() if k != "prompts"}))
    return 0


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="crisp-bench e2e", description=run_e2e.__doc__)
    add_arguments(p)
    return main_from_args(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
