"""Token-granular vertical columns on real Q/K/V: density and error against the block-granular plan.

    python3 scripts/probes/token_columns.py CAPTURE.pt [CAPTURE.pt ...]   # {layer: (q, k, v)} from real.capture

For every layer and head, the reference plan (default CrispConfig) is scored on whole query blocks spread over
the sequence (bench.recall.oracle_positions "spread"): output error vs dense (fp32, rows pooled) and density
(attended keys / causal keys). Variants replace a kept non-sink column block by its heaviest tokens — the
fewest whose window mass (the proxy map's vertical mass v[j]) reaches `rho` of the block's — when that takes
at most `cap` tokens; query blocks that reach the block through a diagonal or local block still see it whole.
A same-density block oracle says how much any block selection could do. Prints a table per capture and
writes JSON next to it (or under $OUT).
"""
from __future__ import annotations

import json
import math
import os
import sys

import torch

from crisp_trt import CrispConfig, reference
from crisp_trt.bench.recall import dense_rows, oracle_positions

VARIANTS = ((0.9, 16), (0.97, 32), (0.99, 32), (0.99, 64))  # (rho, cap)
ROWS = 1024


def token_columns(v_tok: torch.Tensor, columns: torch.Tensor, sink: int, block: int, rho: float, cap: int):
    """Per kept non-sink column block, the kept tokens (list of index tensors) or None (block stays whole)."""
    out = {}
    for c in torch.nonzero(columns).flatten().tolist():
        if c < sink:
            continue
        seg = v_tok[c * block:(c + 1) * block]
        order = seg.argsort(descending=True)
        need = rho * float(seg.sum())
        take = int(torch.searchsorted(seg[order].cumsum(0), torch.tensor(need))) + 1
        if take <= cap:
            out[c] = c * block + order[:take]
    return out


def layer_rows(q, k, v, cfg: CrispConfig):
    """Per head: density and squared errors of plan / variants / oracle on spread rows."""
    n, heads, d = q.shape
    block, group = cfg.block_size, heads // k.shape[1]
    sel, masks = reference.plan(q, k, cfg)
    p_win = reference.proxy_map(q, k, cfg)
    v_tok = p_win.mean(1)  # [H, n]: window vertical mass per key token
    r = oracle_positions(n, block, ROWS, "spread")
    qb = r // block
    blocks, inverse = torch.unique(qb, return_inverse=True)
    pos = torch.arange(n)
    future = pos[None] > r[:, None]
    causal_keys = float((r + 1).sum())
    rows = []
    for h in range(heads):
        p, mass = dense_rows(q[r, h], k[:, h // group], future, block)
        vv = v[:, h // group].float()
        dense = p @ vv
        allowed_blocks = masks[h][qb]  # [R, NB]
        keys = {"plan": allowed_blocks.repeat_interleave(block, -1)[:, :n] & ~future}
        per_block = torch.zeros(len(blocks), mass.shape[-1]).index_add_(0, inverse, mass)
        count = masks[h][blocks].sum(-1)
        oracle = per_block.argsort(-1, descending=True).argsort(-1) < count[:, None]
        keys["oracle"] = oracle[inverse].repeat_interleave(block, -1)[:, :n] & ~future
        vs = int(sel.route[h]) == reference.ROUTE_VERTICAL_SLASH
        for rho, cap in VARIANTS:
            name = f"tok{rho}_{cap}"
            if not vs:
                keys[name] = keys["plan"]
                continue
            toks = token_columns(v_tok[h], sel.columns[h], cfg.sink_blocks, block, rho, cap)
            diag = torch.stack([reference.vertical_slash_union(torch.zeros_like(sel.columns[h]),
                                                               sel.distances[h], int(b)) for b in blocks])
            thin = torch.zeros(mass.shape[-1], dtype=torch.bool)
            thin[list(toks)] = True
            whole = (masks[h][blocks] & ~(thin[None] & ~diag))[inverse]  # thinned blocks go unless a diagonal
            allowed = whole.repeat_interleave(block, -1)[:, :n]
            if toks:
                tok_idx = torch.cat(list(toks.values()))
                allowed[:, tok_idx] = True
            keys[name] = allowed & ~future
        row = dict(head=h, route=int(sel.route[h]), dense_sq=float(dense.square().sum()))
        for name, allowed in keys.items():
            kept = p * allowed
            out = (kept / kept.sum(-1, keepdim=True)) @ vv
            row[f"{name}_sq"] = float((out - dense).square().sum())
            row[f"{name}_density"] = float(allowed.sum()) / causal_keys
            row[f"{name}_mass"] = float(kept.sum(-1).mean())
        rows.append(row)
    return rows


def summarise(rows: list[dict], names) -> dict:
    dense = sum(r["dense_sq"] for r in rows)
    return {name: dict(error=math.sqrt(sum(r[f"{name}_sq"] for r in rows) / dense),
                       density=sum(r[f"{name}_density"] for r in rows) / len(rows),
                       mass=sum(r[f"{name}_mass"] for r in rows) / len(rows)) for name in names}


def main(paths: list[str]) -> None:
    cfg = CrispConfig()
    names = ["plan", "oracle", *(f"tok{rho}_{cap}" for rho, cap in VARIANTS)]
    for path in paths:
        cap = torch.load(path)
        result = {"capture": os.path.basename(path), "config": cfg.to_dict(), "layers": {}}
        all_rows = []
        print(f"{os.path.basename(path)}: layer  " + "  ".join(f"{n:>16}" for n in names), flush=True)
        for layer, (q, k, v) in sorted(cap.items()):
            q, k, v = (t[0].float() for t in (q, k, v))
            rows = layer_rows(q, k, v, cfg)
            all_rows += rows
            s = summarise(rows, names)
            result["layers"][layer] = dict(heads=rows, summary=s)
            print(f"  {layer:>5}  " + "  ".join(f"{s[n]['density']:.3f}/{100 * s[n]['error']:5.2f}%" for n in names),
                  flush=True)
        result["summary"] = summarise(all_rows, names)
        print("  all    " + "  ".join(f"{result['summary'][n]['density']:.3f}/{100 * result['summary'][n]['error']:5.2f}%"
                                      for n in names))
        out = os.path.join(os.environ.get("OUT", os.path.dirname(path)),
                           os.path.basename(path).replace(".pt", "_token_columns.json"))
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
        print("wrote", out)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
