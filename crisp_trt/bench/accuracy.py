"""`crisp-bench accuracy`: real-model retrieval and perplexity, dense vs CRISP vs FlexPrefill-mode (DESIGN.md §6).

Task (induction retrieval, which a 135M model solves densely): real text (crisp_trt.workloads.real) of n
tokens with 8 random words planted at a depth; the prompt ends with the planted words' first 3 and the
answer is the next 3. One teacher-forced forward per (trial, method):
  correct   greedy argmax reproduces every answer token;
  loglik    sum of log-probabilities of the answer tokens;
  lost / gained  trials dense gets right and the method wrong / the other way round (paired counts);
  kl        mean KL(dense || method) of the next-token distributions over the last `kl_positions`.
Method "dense_eager" (a control, not in the default list) is dense attention through HF's eager kernels:
it shows how many trials flip between two dense implementations alone (near-tied answer tokens).
Perplexity: exp(mean NLL) on held-out real text of n tokens. Seeds are fixed per (length, depth, trial),
so every method sees identical prompts. JSON: bench/results/accuracy_latest.json; one heat-map PNG
per method (depth × length, accuracy).
"""
from __future__ import annotations

import json
import math
import os
import random
import re

import torch

from ..config import METHODS as CONFIG_METHODS
from ..config import CrispConfig, method_config
from ..workloads.real import held_out_text, real_text

METHODS = ("dense", "crisp", "flexprefill")
CONTROLS = ("dense_eager",)  # dense attention through HF's eager kernels: the noise floor of a cell
KNOWN = ("dense", *CONFIG_METHODS, *CONTROLS)
MIN_LENGTH = 128


def check_arguments(lengths, depths, trials, methods, flag: str = "") -> None:
    """ValueError naming the first bad argument (flag + its name: "--" from the CLI), before any model loads."""
    unknown = sorted(set(methods) - set(KNOWN))
    if not methods or unknown:
        raise ValueError(f"{flag}methods: unknown {unknown or 'empty list'}; expected some of {', '.join(KNOWN)}")
    if not lengths or any(int(n) < MIN_LENGTH for n in lengths):  # room for the planted words and the cue
        raise ValueError(f"{flag}lengths: expected token counts ≥ {MIN_LENGTH} (got {list(lengths)})")
    if depths and trials < 1:
        raise ValueError(f"{flag}trials: expected ≥ 1 (got {trials})")
    bad = [d for d in depths if not 0.0 <= d <= 1.0]
    if bad:
        raise ValueError(f"{flag}depths: expected fractions in [0, 1] (got {bad})")


def _word_pool(text: str) -> list[str]:
    return sorted({w.lower() for w in re.findall(r"[A-Za-z]{4,9}", text)})


def make_trial(tok, n: int, depth: float, seed: int, filler_ids: torch.Tensor, pool: list[str]):
    rng = random.Random(seed)
    words = rng.sample(pool, 8)
    needle = tok(" " + " ".join(words) + ".", add_special_tokens=False).input_ids
    cue = tok(" " + " ".join(words[:3]), add_special_tokens=False).input_ids
    answer = tok(" " + " ".join(words[3:6]), add_special_tokens=False).input_ids
    room = n - len(needle) - len(cue) - len(answer)
    start = rng.randrange(0, max(1, filler_ids.numel() - room))
    filler = filler_ids[start:start + room].tolist()
    at = int(round(depth * len(filler)))
    ids = filler[:at] + needle + filler[at:] + cue + answer
    return torch.tensor([ids]), len(answer)


def _apply(model, method: str, base: CrispConfig):
    from ..hf import set_crisp_config
    from ..models import set_attn_implementation

    if method == "dense":
        set_attn_implementation(model, "sdpa")
    elif method == "dense_eager":
        set_attn_implementation(model, "eager")
    else:
        set_attn_implementation(model, "crisp")
        set_crisp_config(model, method_config(method, base))


def run_accuracy(lengths=(2048, 4096, 8192), depths=(0.0, 0.25, 0.5, 0.75, 1.0), trials=30, methods=METHODS,
                 base: CrispConfig | None = None, kl_positions=16, device=None, model=None, tok=None,
                 progress=None, perplexity=True, model_path=None):
    """Cells per (method, n, depth) and perplexity per (method, n). The model (default: the bundled
    SmolLM2, or model_path) runs in bf16 on CUDA (the kernels' dtype), fp32 on the CPU."""
    from ..models import load_model

    check_arguments(lengths, depths, trials, methods)
    base = base or CrispConfig()
    if model is None:
        cuda = device is not None and torch.device(device).type == "cuda"
        model, tok = load_model(model_path, attn_implementation="sdpa", device=device,
                                dtype=torch.bfloat16 if cuda else torch.float32)
    dev = next(model.parameters()).device
    text = real_text()
    filler_ids = tok(text, return_tensors="pt").input_ids[0]
    pool = _word_pool(text)
    cells = []
    for n in lengths:
        for depth in depths:
            per = {m: {"correct": 0, "lost": 0, "gained": 0, "loglik": 0.0, "kl": 0.0} for m in methods}
            for t in range(trials):
                ids, na = make_trial(tok, n, depth, seed=hash((n, int(depth * 1000), t)) & 0xFFFFFFF,
                                     filler_ids=filler_ids, pool=pool)
                ids = ids.to(dev)
                dense_logp, dense_ok = None, None
                for m in ("dense",) + tuple(x for x in methods if x != "dense"):
                    _apply(model, m, base)
                    keep = max(kl_positions, na + 1)  # logits of the last positions only
                    with torch.no_grad():
                        logp = torch.log_softmax(model(ids, logits_to_keep=keep).logits[0].float(), -1)
                    target = ids[0, -na:]
                    pred = logp[-na - 1:-1]
                    ok = bool((pred.argmax(-1) == target).all())
                    if m == "dense":
                        dense_logp, dense_ok = logp[-kl_positions:], ok
                    if m in per:
                        per[m]["correct"] += int(ok)
                        per[m]["lost"] += int(dense_ok and not ok)
                        per[m]["gained"] += int(ok and not dense_ok)
                        per[m]["loglik"] += float(pred.gather(1, target[:, None]).sum())
                        kl = (dense_logp.exp() * (dense_logp - logp[-kl_positions:])).sum(-1).mean()
                        per[m]["kl"] += float(kl)
                    if progress is not None:
                        progress.update(1)
            for m in methods:
                cells.append(dict(method=m, n=n, depth=depth, trials=trials, accuracy=per[m]["correct"] / trials,
                                  lost=per[m]["lost"], gained=per[m]["gained"],
                                  loglik=per[m]["loglik"] / trials, kl=per[m]["kl"] / trials))
    ppl = []
    if perplexity:
        held = tok(held_out_text(), return_tensors="pt").input_ids[0]
        for n in lengths:
            ids = held.repeat(-(-n // held.numel()))[:n][None].to(dev)
            for m in methods:
                _apply(model, m, base)
                with torch.no_grad():
                    out = model(ids, labels=ids)
                ppl.append(dict(method=m, n=n, perplexity=math.exp(float(out.loss))))
    _apply(model, "dense", base)
    return {"task": "induction_retrieval", "config": base.to_dict(), "cells": cells, "perplexity": ppl}


def write_results(result, out_dir="bench/results", plots=True) -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "accuracy_latest.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    if plots:
        heatmaps(result, out_dir)
    return path


def heatmaps(result, out_dir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = result["cells"]
    lengths = sorted({c["n"] for c in cells})
    depths = sorted({c["depth"] for c in cells})
    for m in sorted({c["method"] for c in cells}):
        grid = [[next(c["accuracy"] for c in cells if c["method"] == m and c["n"] == n and c["depth"] == d)
                 for n in lengths] for d in depths]
        fig, ax = plt.subplots(figsize=(1.2 + 1.1 * len(lengths), 1 + 0.5 * len(depths)))
        im = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
        ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths])
        for i, row in enumerate(grid):
            for j, val in enumerate(row):
                ax.text(j, i, f"{val:.2f}", ha="center", va="center", color="w", fontsize=7)
        ax.set_xlabel("length")
        ax.set_ylabel("needle depth")
        ax.set_title(f"retrieval accuracy: {m}")
        fig.colorbar(im)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, f"accuracy_{m}.png"), dpi=120)
        plt.close(fig)
