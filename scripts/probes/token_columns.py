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

import sys

import torch
from capture_rows import Head, Rows, run

from crisp_trt import CrispConfig, reference

VARIANTS = ((0.9, 16), (0.97, 32), (0.99, 32), (0.99, 64))  # (rho, cap)


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
    n, heads, _ = q.shape
    block, group = cfg.block_size, heads // k.shape[1]
    sel, masks = reference.plan(q, k, cfg)
    v_tok = reference.proxy_map(q, k, cfg).mean(1)  # [H, n]: window vertical mass per key token
    rows, out = Rows(n, block), []
    for h in range(heads):
        head = Head(rows, q[rows.r, h], k[:, h // group], v[:, h // group])
        chosen = masks[h][rows.blocks]
        keys = {"plan": rows.keys(chosen), "oracle": head.oracle(chosen.sum(-1))}
        vs = int(sel.route[h]) == reference.ROUTE_VERTICAL_SLASH
        for rho, cap in VARIANTS:
            name = f"tok{rho}_{cap}"
            if not vs:
                keys[name] = keys["plan"]
                continue
            toks = token_columns(v_tok[h], sel.columns[h], cfg.sink_blocks, block, rho, cap)
            diag = torch.stack([reference.vertical_slash_union(torch.zeros_like(sel.columns[h]),
                                                               sel.distances[h], int(b)) for b in rows.blocks])
            thin = torch.zeros(chosen.shape[-1], dtype=torch.bool)
            thin[list(toks)] = True
            allowed = rows.keys(chosen & ~(thin[None] & ~diag))  # thinned blocks go unless a diagonal
            if toks:
                allowed[:, torch.cat(list(toks.values()))] = True
            keys[name] = allowed & ~rows.future
        row = dict(head=h, route=int(sel.route[h]), dense_sq=float(head.dense.square().sum()))
        for name, allowed in keys.items():
            row.update(head.score(name, allowed))
        out.append(row)
    return out


def main(paths: list[str]) -> None:
    cfg = CrispConfig()
    names = ["plan", "oracle", *(f"tok{rho}_{cap}" for rho, cap in VARIANTS)]
    run(paths, lambda q, k, v: layer_rows(q, k, v, cfg), names, "_token_columns", {"config": cfg.to_dict()})


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
