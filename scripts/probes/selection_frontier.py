"""Which block selection comes closest to the oracle on real attention: error against density per config.

    python3 scripts/probes/selection_frontier.py CAPTURE.pt [CAPTURE.pt ...]   # {layer: (q, k, v)}, real.capture

CRISP's default keeps ~0.8 of the blocks of Qwen at 16k at 4–5× the error of a same-density block oracle
(session 13/14). Here every config of a fixed grid (CRISP's knobs, block-sparse routing for every head,
cumulative budgets, FlexPrefill-mode) and two selections no config expresses — the default plan plus, per query
block, the `m` key blocks with the highest pooled q·k score ("+pooled m"), or the blocks some row of it would
give more than t of its mass against the blocks' mean keys ("<config>+rowmax<t>": CrispConfig.spike = t) — is scored on the same rows: whole
query blocks spread over the sequence (bench.recall.oracle_positions "spread"), output error vs dense (fp32,
squared errors pooled over heads and layers) and density (attended / causal keys), beside the block oracle
at each one's own per-row counts. Use calibration captures only (the default must not be tuned on evaluation
text). Prints a table per capture and writes <capture>_selection.json (or under $OUT). LAYERS=11,16 and
SELECTIONS=default+rowmax0.03,... restrict the run (the default plan is always scored).
"""
from __future__ import annotations

import math
import os
import sys

import torch
from capture_rows import Head, Rows, run

from crisp_trt import CrispConfig, reference
from crisp_trt.config import method_config

CONFIGS = {
    "default": CrispConfig(),
    "kappa4": CrispConfig(kappa=4.0),
    "kappa16": CrispConfig(kappa=16.0),
    "kappa32": CrispConfig(kappa=32.0),
    "cov0.99": CrispConfig(coverage=0.99),
    "cov0.95": CrispConfig(coverage=0.95),
    "all_block_sparse": CrispConfig(tau=2.0),
    "crisp_gamma0.95": CrispConfig(budget="cumulative", gamma=0.95),
    "crisp_gamma0.98": CrispConfig(budget="cumulative", gamma=0.98),
    "crisp_gamma0.99": CrispConfig(budget="cumulative", gamma=0.99),
    "crisp_gamma0.995": CrispConfig(budget="cumulative", gamma=0.995),
    "flexprefill": method_config("flexprefill"),
}
POOLED_EXTRA = (2, 4, 8)  # "+pooled m" on top of the default plan
ROWMAX_EXTRA = (0.1, 0.03, 0.01)  # "<config>+rowmax<t>" on top of these configs' plans:
ROWMAX_ON = ("default", "cov0.99", "crisp_gamma0.99", "crisp_gamma0.995")


def pooled_top(q: torch.Tensor, k: torch.Tensor, block: int, m: int) -> torch.Tensor:
    """bool [H, nb, nb]: per head and query block, the m earlier key blocks (diagonal excluded) with the highest
    pooled-q · pooled-k score (block means, scaled like attention)."""
    n, heads, d = q.shape
    pq = reference.pool_blocks(q.float(), block)  # [nb, H, d]
    pk = reference._expand_kv(reference.pool_blocks(k.float(), block), heads)
    score = torch.einsum("qhd,khd->hqk", pq, pk) / math.sqrt(d)
    nb = score.shape[-1]
    earlier = torch.ones(nb, nb, dtype=torch.bool).tril(-1)
    score = score.masked_fill(~earlier, float("-inf"))
    top = score.topk(min(m, nb), -1).indices
    out = torch.zeros_like(score, dtype=torch.bool).scatter_(-1, top, True)
    return out & earlier


def layer_rows(q, k, v, masks_by_name: dict) -> list[dict]:
    """Per head and selection: squared error, density and the same-count block oracle's squared error."""
    n, heads, _ = q.shape
    block, group = CrispConfig().block_size, heads // k.shape[1]
    rows, out = Rows(n, block), []
    for h in range(heads):
        head = Head(rows, q[rows.r, h], k[:, h // group], v[:, h // group])
        row = dict(head=h, dense_sq=float(head.dense.square().sum()))
        for name, masks in masks_by_name.items():
            chosen = masks[h][rows.blocks]  # [len(blocks), NB]
            row.update(head.score(name, rows.keys(chosen)))
            row[f"{name}_oracle_sq"] = head.squared_error(head.oracle(chosen.sum(-1)))
        out.append(row)
    return out


def masks_of(q, k, names) -> dict:
    """bool [H, nb, nb] block masks of every selection in `names` for one layer."""
    block = CrispConfig().block_size
    masks = {name: reference.plan(q, k, cfg)[1] for name, cfg in CONFIGS.items() if name in names}
    for m in POOLED_EXTRA:
        if f"+pooled{m}" in names:
            masks[f"+pooled{m}"] = masks["default"] | pooled_top(q, k, block, m)
    if any("+rowmax" in name for name in names):
        spikes = reference.spike_mass(q, k, block)  # CrispConfig.spike's detector
        for base in ROWMAX_ON:
            for t in ROWMAX_EXTRA:
                if f"{base}+rowmax{t}" in names:
                    masks[f"{base}+rowmax{t}"] = reference.add_spikes(masks[base], spikes > t,
                                                                      CONFIGS[base].max_blocks)
    return masks


def main(paths: list[str]) -> None:
    names = [*CONFIGS, *(f"+pooled{m}" for m in POOLED_EXTRA),
             *(f"{base}+rowmax{t}" for base in ROWMAX_ON for t in ROWMAX_EXTRA)]
    only = {int(x) for x in os.environ.get("LAYERS", "").split(",") if x}  # a quick look at some layers
    if os.environ.get("SELECTIONS"):  # and at some selections (default always, the extras build on it)
        asked = [x for x in os.environ["SELECTIONS"].split(",") if x]
        if any(x not in names for x in asked):
            sys.exit(f"SELECTIONS: {[x for x in asked if x not in names]} unknown; expected any of {', '.join(names)}")
        wanted = [x for x in asked if x != "default"]
        names = ["default", *{x.split("+rowmax")[0]: 0 for x in wanted if x.split("+rowmax")[0] in CONFIGS}, *wanted]
        names = list(dict.fromkeys(names))
    meta = {"configs": {k: c.to_dict() for k, c in CONFIGS.items()}, "pooled_extra": POOLED_EXTRA}
    run(paths, lambda q, k, v: layer_rows(q, k, v, masks_of(q, k, names)), names, "_selection", meta, only)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
