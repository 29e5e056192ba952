"""What the capture probes (token_columns.py, selection_frontier.py) share: scoring a key selection on real Q/K/V.

A selection is scored on whole query blocks spread over the sequence (bench.recall.oracle_positions "spread"):
per head, its output's squared error against dense (fp32), its density (attended / causal keys) and, beside
it, the same-count block oracle (per query block, the key blocks with the most true mass). `run` walks every
layer of one or more captures ({layer: (q, k, v)}, workloads.real.capture), prints a line per layer and a
summary, and writes <capture><suffix>.json next to it (or under $OUT).
"""
from __future__ import annotations

import json
import math
import os

import torch

from crisp_trt.bench.recall import oracle_positions
from crisp_trt.reference import dense_rows

ROWS = 1024


class Rows:
    """The scored query rows r of an n-token sequence, their query blocks and causal mask."""

    def __init__(self, n: int, block: int, rows: int = ROWS):
        self.n, self.block = n, block
        self.r = oracle_positions(n, block, rows, "spread")
        self.qb = self.r // block
        self.blocks, self.inverse = torch.unique(self.qb, return_inverse=True)
        self.future = torch.arange(n)[None] > self.r[:, None]
        self.causal_keys = float((self.r + 1).sum())

    def keys(self, chosen: torch.Tensor) -> torch.Tensor:
        """Block choices per scored query block bool [len(blocks), NB] → allowed keys per row bool [R, n]."""
        return chosen[self.inverse].repeat_interleave(self.block, -1)[:, :self.n] & ~self.future


class Head:
    """One head's dense softmax rows, output, key-block mass per row and per scored query block (and its ranks)."""

    def __init__(self, rows: Rows, q_rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        self.rows = rows
        self.p, self.mass = dense_rows(q_rows, k, rows.future, rows.block)  # mass: per row and key block
        self.v = v.float()
        self.dense = self.p @ self.v
        self.per_block = torch.zeros(len(rows.blocks), self.mass.shape[-1]).index_add_(0, rows.inverse, self.mass)
        self.rank = self.per_block.argsort(-1, descending=True).argsort(-1)

    def squared_error(self, allowed: torch.Tensor) -> float:
        kept = self.p * allowed
        return float(((kept / kept.sum(-1, keepdim=True)) @ self.v - self.dense).square().sum())

    def oracle(self, count: torch.Tensor) -> torch.Tensor:
        """Allowed keys of the same-count block oracle: count [len(blocks)] key blocks per scored query block."""
        return self.rows.keys(self.rank < count[:, None])

    def score(self, name: str, allowed: torch.Tensor) -> dict:
        """{name_sq, name_density, name_mass} of one selection's allowed keys."""
        return {f"{name}_sq": self.squared_error(allowed),
                f"{name}_density": float(allowed.sum()) / self.rows.causal_keys,
                f"{name}_mass": float((self.p * allowed).sum(-1).mean())}


def summarise(rows: list[dict], names) -> dict:
    """Per selection over head rows: mean density and mass, error pooled over heads (√(Σ sq / Σ dense sq)), and
    the oracle's error where the rows carry it."""
    dense = sum(r["dense_sq"] for r in rows)
    out = {}
    for name in names:
        s = dict(density=sum(r[f"{name}_density"] for r in rows) / len(rows),
                 error=math.sqrt(sum(r[f"{name}_sq"] for r in rows) / dense),
                 mass=sum(r[f"{name}_mass"] for r in rows) / len(rows))
        if f"{name}_oracle_sq" in rows[0]:
            s["oracle_error"] = math.sqrt(sum(r[f"{name}_oracle_sq"] for r in rows) / dense)
        out[name] = s
    return out


def run(paths, layer_rows, names, suffix: str, meta: dict, layers=None) -> None:
    """For each capture: layer_rows(q, k, v) (fp32 [n, H, d] / [n, Hkv, d]) → head rows per layer (optionally only
    `layers`), summarised per layer and over all; printed, and written with `meta` to <capture><suffix>.json."""
    for path in paths:
        captured = torch.load(path, map_location="cpu")
        name = os.path.basename(path)
        result = {"capture": name, **meta, "layers": {}}
        all_rows = []
        for layer, (q, k, v) in sorted(captured.items()):
            if layers and layer not in layers:
                continue
            rows = layer_rows(*(t[0].float() for t in (q, k, v)))
            all_rows += rows
            s = summarise(rows, names)
            result["layers"][layer] = dict(heads=rows, summary=s)
            print(f"{name} layer {layer:>2}: " + "  ".join(
                f"{n} {s[n]['density']:.3f}/{100 * s[n]['error']:.2f}%" for n in names), flush=True)
        result["summary"] = summarise(all_rows, names)
        has_oracle = "oracle_error" in next(iter(result["summary"].values()))
        print(f"\n{name}, all layers:\n{'selection':<30}{'density':>9}{'error %':>9}" + ("oracle %".rjust(9) if has_oracle else ""))
        for n, s in sorted(result["summary"].items(), key=lambda kv: kv[1]["density"]):
            print(f"{n:<30}{s['density']:>9.3f}{100 * s['error']:>9.2f}"
                  + (f"{100 * s['oracle_error']:>9.2f}" if has_oracle else ""))
        out = os.path.join(os.environ.get("OUT", os.path.dirname(path)), name.replace(".pt", suffix + ".json"))
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
        print("wrote", out)
