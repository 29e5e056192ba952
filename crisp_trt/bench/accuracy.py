"""`crisp-bench accuracy`: real-model retrieval and perplexity, dense vs CRISP vs FlexPrefill-mode (docs/design.md, "Measuring").

Tasks (TASKS), each a haystack of n tokens of real text with something planted at a depth:
  words     induction retrieval (a 135M model solves it densely): 8 random words planted; the prompt ends
            with their first 3 and the answer is the next 3 (haystack: the licence texts, workloads.real);
  passkey   a 5-digit pass key planted, asked for at the end (haystack: a texts corpus, chat-framed);
  multikey  RULER-style multi-key needles: 4 "special magic number for <word>" sentences, one at the depth,
            three at random depths; one word is asked for (the answer is its 7-digit number).
One teacher-forced forward per (trial, method):
  correct   greedy argmax reproduces every answer token;
  loglik    sum of log-probabilities of the answer tokens;
  lost / gained  trials dense gets right and the method wrong / the other way round (paired counts);
  kl        mean KL(dense || method) of the next-token distributions over the last `kl_positions`.
Method "dense_eager" (a control, not in the default list) is dense attention through HF's eager kernels:
it shows how many trials flip between two dense implementations alone (near-tied answer tokens).
Perplexity: exp(mean NLL) on held-out real text of n tokens (the licence tail, or a texts corpus), its
logits computed in chunks. Seeds are fixed per (task, length, depth, trial), so every method sees identical
prompts. `rope(n)` may switch the model's RoPE per length (e.g. YaRN above the native context). JSON: bench/results/latest/accuracy/accuracy_latest.json; one heat-map PNG
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
TASKS = ("words", "passkey", "multikey")
CONTROLS = ("dense_eager",)  # dense attention through HF's eager kernels: the noise floor of a cell
KNOWN = ("dense", *CONFIG_METHODS, *CONTROLS)
MIN_LENGTH = 128


def check_arguments(lengths, depths, trials, methods, flag: str = "", task: str = "words",
                    configs: dict | None = None) -> None:
    """ValueError naming the first bad argument (flag + its name: "--" from the CLI), before any model loads.
    `configs` names extra CRISP configs that count as known methods."""
    if task not in TASKS:
        raise ValueError(f"{flag}task: expected one of {', '.join(TASKS)} (got {task!r})")
    unknown = sorted(set(methods) - set(KNOWN) - set(configs or {}))
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


def chat_frame(tok) -> tuple[list, list]:
    """Token ids before and after a user message in the tokenizer's chat template (the generation prompt
    included); ([], []) when it has none."""
    if not getattr(tok, "chat_template", None):
        return [], []
    mark = "\u2063MSG\u2063"
    text = tok.apply_chat_template([{"role": "user", "content": mark}], add_generation_prompt=True, tokenize=False)
    head, tail = text.split(mark)
    return (tok(head, add_special_tokens=False).input_ids, tok(tail, add_special_tokens=False).input_ids)


def make_needle_trial(tok, task: str, n: int, depth: float, seed: int, filler_ids: torch.Tensor, pool: list[str],
                      frame: tuple[list, list] = ([], [])):
    """(ids [1, n], answer length) of a passkey / multikey prompt: frame head, haystack with the needle(s),
    the question, frame tail, the answer's lead-in and the answer (teacher-forced)."""
    rng = random.Random(seed)
    enc = lambda text: tok(text, add_special_tokens=False).input_ids  # noqa: E731
    if task == "passkey":
        key = str(rng.randrange(10000, 100000))
        needles = [(depth, enc(f" The pass key is {key}. Remember it. {key} is the pass key. "))]
        question, lead = "\n\nWhat is the pass key?", "The pass key is"
    else:
        words = rng.sample(pool, 4)
        numbers = [str(rng.randrange(1_000_000, 10_000_000)) for _ in words]
        needles = [(depth if i == 0 else rng.random(),
                    enc(f" One of the special magic numbers for {w} is: {x}. ")) for i, (w, x) in enumerate(zip(words, numbers))]
        key = numbers[0]
        question = f"\n\nWhat is the special magic number for {words[0]} mentioned in the provided text?"
        lead = f"The special magic number for {words[0]} mentioned in the provided text is"
    tail = enc(question) + frame[1] + enc(lead)
    answer = enc(" " + key)
    room = n - len(frame[0]) - sum(len(x) for _, x in needles) - len(tail) - len(answer)
    if room < 0:
        raise ValueError(f"lengths: {n} tokens cannot hold the {task} prompt (needs {n - room})")
    start = rng.randrange(0, max(1, filler_ids.numel() - room))
    filler = filler_ids[start:start + room].tolist()
    for at, needle in sorted(((int(round(d * len(filler))), x) for d, x in needles), key=lambda t: -t[0]):
        filler[at:at] = needle  # deepest first, so earlier positions stay valid
    return torch.tensor([frame[0] + filler + tail + answer]), len(answer)


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


GRAPHS = "_graphs"  # a CRISP method's name + this: the same config, CUDA prefills replayed from graphs


def use_method(model, method: str, base: CrispConfig, configs: dict | None = None):
    """Switch a loaded model to a method: dense (SDPA), dense_eager, a config.METHODS name built on `base`, or
    a name in `configs` (an explicit CrispConfig); either of the last two + GRAPHS runs it through
    crisp_trt.graphs. The benches' one way to change attention between runs."""
    from ..hf import set_crisp_config, set_cuda_graphs
    from ..models import set_attn_implementation

    graphs = method.endswith(GRAPHS) and method not in (configs or {})
    name = method.removesuffix(GRAPHS) if graphs else method
    if graphs and name in ("", "dense", "dense_eager"):
        raise ValueError(f"method={method!r}: the {GRAPHS} suffix follows a CRISP method's name, e.g. crisp{GRAPHS}")
    if method == "dense":
        set_attn_implementation(model, "sdpa")
    elif method == "dense_eager":
        set_attn_implementation(model, "eager")
    else:
        set_attn_implementation(model, "crisp")
        set_crisp_config(model, (configs or {}).get(name) or method_config(name, base))
        set_cuda_graphs(model, graphs)


def use_rope(model, rope, n: int) -> None:
    """Set the model's RoPE for n tokens to rope(n) (a scaling dict, or None: native); rope None keeps the model's
    own. The benches' one way to change RoPE between lengths."""
    if rope is not None:
        from ..models import set_rope_scaling

        set_rope_scaling(model, rope(n))


def _haystack(tok, task: str, haystack: str | None):
    """(filler ids, word pool) of a task's haystack: a texts corpus by name, else the licence texts."""
    from ..workloads.texts import corpus

    text = real_text() if haystack is None else corpus(haystack)
    return tok(text, return_tensors="pt").input_ids[0], _word_pool(text)


def chunked_logp(model, ids: torch.Tensor, chunk: int = 4096):
    """Yield (a, b, log-probs [b - a, vocab] float32) of positions a..b-1 predicting ids[a+1..b] for ids [1, n]:
    one forward, the LM head applied `chunk` positions at a time (n × vocab float32 logits at once would
    take 20 GB at 32k for a 152k vocabulary)."""
    with torch.no_grad():
        hidden = model.model(ids, use_cache=False).last_hidden_state[0]
        head = model.get_output_embeddings()
        for a in range(0, ids.shape[1] - 1, chunk):
            b = min(a + chunk, ids.shape[1] - 1)
            yield a, b, torch.log_softmax(head(hidden[a:b]).float(), -1)


def nll(model, ids: torch.Tensor) -> float:
    """Mean next-token negative log-likelihood of ids [1, n]."""
    total = sum(-float(logp.gather(1, ids[0, a + 1:b + 1, None]).sum()) for a, b, logp in chunked_logp(model, ids))
    return total / (ids.shape[1] - 1)


def run_accuracy(lengths=(2048, 4096, 8192), depths=(0.0, 0.25, 0.5, 0.75, 1.0), trials=30, methods=METHODS,
                 base: CrispConfig | None = None, kl_positions=16, device=None, model=None, tok=None,
                 progress=None, perplexity=True, model_path=None, task: str = "words", haystack: str | None = None,
                 configs: dict | None = None, rope=None, perplexity_text: str | None = None):
    """Cells per (method, n, depth) and perplexity per (method, n). The model (default: the bundled
    SmolLM2, or model_path) runs in bf16 on CUDA (the kernels' dtype), fp32 on the CPU.
    task: one of TASKS; haystack: a texts corpus name (None: the licence texts); configs: extra named CRISP
    configs usable as methods; rope: n → rope scaling dict or None, applied before each length (None: the
    model's own; "auto": models.rope_for, YaRN past the native context); perplexity_text: a texts corpus for perplexity (None: the licence tail)."""
    from ..models import load_model, rope_for
    from ..workloads.texts import corpus

    check_arguments(lengths, depths, trials, methods, task=task, configs=configs)
    base = base or CrispConfig()
    if model is None:
        cuda = device is not None and torch.device(device).type == "cuda"
        model, tok = load_model(model_path, attn_implementation="sdpa", device=device,
                                dtype=torch.bfloat16 if cuda else torch.float32)
    dev = next(model.parameters()).device
    if rope == "auto":
        rope = rope_for(model)
    filler_ids, pool = _haystack(tok, task, haystack)
    frame = chat_frame(tok) if task != "words" else ([], [])
    salt = TASKS.index(task) * 7919
    cells = []
    for n in lengths:
        use_rope(model, rope, n)
        for depth in depths:
            per = {m: {"correct": 0, "lost": 0, "gained": 0, "loglik": 0.0, "kl": 0.0} for m in methods}
            for t in range(trials):
                seed = hash((n, int(depth * 1000), t + salt)) & 0xFFFFFFF
                ids, na = make_trial(tok, n, depth, seed=seed, filler_ids=filler_ids, pool=pool) if task == "words" \
                    else make_needle_trial(tok, task, n, depth, seed, filler_ids, pool, frame)
                ids = ids.to(dev)
                dense_logp, dense_ok = None, None
                for m in ("dense",) + tuple(x for x in methods if x != "dense"):
                    use_method(model, m, base, configs)
                    keep = max(kl_positions, na + 1)  # logits of the last positions only
                    with torch.no_grad():
                        logp = torch.log_softmax(model(ids, logits_to_keep=keep, use_cache=False).logits[0].float(), -1)
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
        text = held_out_text() if perplexity_text is None else corpus(perplexity_text)
        held = tok(text, return_tensors="pt").input_ids[0]
        for n in lengths:
            use_rope(model, rope, n)
            ids = held.repeat(-(-n // held.numel()))[:n][None].to(dev)
            for m in methods:
                use_method(model, m, base, configs)
                ppl.append(dict(method=m, n=n, perplexity=math.exp(nll(model, ids))))
    use_method(model, "dense", base)
    configs_used = {m: c.to_dict() for m, c in (configs or {}).items() if m in methods}
    return {"task": "induction_retrieval" if task == "words" else task, "haystack": haystack or "licenses",
            "config": base.to_dict(), "configs": configs_used, "cells": cells, "perplexity": ppl}


def write_results(result, out_dir="bench/results/latest/accuracy", plots=True) -> str:
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
