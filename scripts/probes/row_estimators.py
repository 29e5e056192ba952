"""How close can a cheap per-query-block estimate of block mass get to the block oracle on real attention?

    python3 scripts/probes/row_estimators.py CAPTURE.pt [CAPTURE.pt ...]   # {layer: (q, k, v)}, real.capture

The Qwen oracle (session 21, CPU 8k) keeps the model's answers at density 0.33 with coverage 0.95 per query
block; CRISP's default needs 0.74. Each selection here keeps, per head and scored query block, the key blocks
with the largest *estimated* mass (diagonal first) until the estimate covers c of it:
  oracle_c      the true mass, mean over the block's rows (what the oracle of bench.oracle keeps)
  rowsS_c       exact softmax rows of S strided rows of the block (the last of every B/S rows), their summed mass
                (what estimators.estimated_mass "rowsS" and CrispConfig.rows compute): costs S/B of the dense logits
  pooledS_c     S strided rows against the key blocks' mean keys (softmax over blocks, the row's own block
                causal-partial, where the spike stage's detector takes its whole mean): costs S/B²
  antidiagS_c   XAttention's estimate: every S consecutive rows against every S consecutive keys summed along
                the antidiagonal (q_{gS+s} · k_{jS+S-1-s}), divided by S, softmax over the key groups, summed
                per block: costs 1/S of the dense logits and 1/S² of their exponentials
  rawS_c        rowsS without each row's own normalisation: exp(logit − the block's largest) summed over its rows
                (what one pass over the keys could compute; rows with a larger partition function weigh more)
  default       CRISP's default plan (reference.plan), for the density and error it has today
Scored as capture_rows scores every probe: output error against dense (fp32, pooled over heads) and density
(attended / causal keys) on whole query blocks spread over the sequence. Calibration captures only. Prints a
table per capture and writes <capture>_estimators.json (or under $OUT). LAYERS=0,11 restricts the layers.
"""
from __future__ import annotations

import math
import os
import sys

import torch
from capture_rows import Head, Rows, run

from crisp_trt import CrispConfig, reference
from crisp_trt.bench.estimators import antidiagonal_mass, coverage_keep

COVERAGES = (0.9, 0.95, 0.98)
SAMPLES = (4, 16)
STRIDES = (8, 16)


def pooled_mass(q_rows: torch.Tensor, k: torch.Tensor, r: torch.Tensor, block: int) -> torch.Tensor:
    """[R, NB]: per row, softmax over the key blocks j ≤ its block of q · k̄_j / sqrt(d), k̄_j the mean of block
    j's keys (its own block: the keys up to the row)."""
    n, d = k.shape
    nb = reference.num_blocks(n, block)
    pk = reference.pool_blocks(k[:, None], block)[:, 0]  # [NB, d]
    logits = q_rows.float() @ pk.T / math.sqrt(d)
    qb = r // block
    ks = torch.cumsum(k.float(), 0)
    start = qb * block
    own = (ks[r] - torch.where(start[:, None] > 0, ks[(start - 1).clamp_min(0)], torch.zeros(1, d))) \
        / (r - start + 1)[:, None]
    logits[torch.arange(len(r)), qb] = (q_rows.float() * own).sum(-1) / math.sqrt(d)
    logits = logits.masked_fill(torch.arange(nb)[None] > qb[:, None], float("-inf"))
    return torch.softmax(logits, -1)


def unnormalised_mass(q_rows: torch.Tensor, k: torch.Tensor, r: torch.Tensor, inv: torch.Tensor, blocks: int,
                      block: int) -> torch.Tensor:
    """[blocks, NB]: per scored query block (inv: each row's), Σ over its rows of exp(logit − the block's largest
    logit) per key block, causal: no row normalised by its own sum."""
    n, d = k.shape
    logits = (q_rows.float() @ k.float().T / math.sqrt(d)).masked_fill(torch.arange(n)[None] > r[:, None],
                                                                          float("-inf"))
    top = torch.full((blocks,), float("-inf")).index_reduce_(0, inv, logits.amax(-1), "amax")
    e = torch.exp(logits - top[inv][:, None])
    nb = reference.num_blocks(n, block)
    return torch.zeros(blocks, nb).index_add_(0, inv, torch.nn.functional.pad(e, (0, nb * block - n)).view(
        len(r), nb, block).sum(-1))


def layer_rows(q, k, v, names) -> list[dict]:
    n, heads, _ = q.shape
    cfg = CrispConfig()
    block, group = cfg.block_size, heads // k.shape[1]
    rows = Rows(n, block)
    qb = rows.blocks
    default = reference.plan(q, k, cfg)[1] if "default" in names else None
    picks = {s: torch.searchsorted(rows.r, reference.sampled_rows(qb, block, s, 0, n).flatten()) for s in SAMPLES}
    out = []
    for h in range(heads):
        kh = k[:, h // group]
        head = Head(rows, q[rows.r, h], kh, v[:, h // group])
        row = dict(head=h, dense_sq=float(head.dense.square().sum()))
        ests = {"oracle": head.per_block}
        for s, pick in picks.items():
            inv = rows.inverse[pick]
            ests[f"rows{s}"] = torch.zeros_like(head.per_block).index_add_(0, inv, head.mass[pick])
            pm = pooled_mass(q[rows.r[pick], h], kh, rows.r[pick], block)
            ests[f"pooled{s}"] = torch.zeros_like(head.per_block).index_add_(0, inv, pm)
            ests[f"raw{s}"] = unnormalised_mass(q[rows.r[pick], h], kh, rows.r[pick], inv, len(qb), block)
        for s in STRIDES:  # one scored query block at a time: they are spread, antidiagonal_mass wants a prefix
            ests[f"antidiag{s}"] = torch.cat([
                torch.nn.functional.pad(antidiagonal_mass(q[b * block:(b + 1) * block, h], kh[:(b + 1) * block],
                                                          b * block, block, s), (0, len(head.per_block[0]) - b - 1))
                for b in qb.tolist()])
        for est_name, est in ests.items():
            for c in COVERAGES:
                if f"{est_name}_{c}" in names:
                    row.update(head.score(f"{est_name}_{c}", rows.keys(coverage_keep(est, qb, c))))
        if default is not None:
            row.update(head.score("default", rows.keys(default[h][qb])))
        out.append(row)
    return out


def main(paths: list[str]) -> None:
    names = [f"{e}_{c}" for e in ("oracle", *(f"{kind}{s}" for kind in ("rows", "pooled", "raw") for s in SAMPLES),
                                       *(f"antidiag{s}" for s in STRIDES))
             for c in COVERAGES] + ["default"]
    only = {int(x) for x in os.environ.get("LAYERS", "").split(",") if x}
    meta = {"coverages": COVERAGES, "samples": SAMPLES, "strides": STRIDES, "default": CrispConfig().to_dict()}
    run(paths, lambda q, k, v: layer_rows(q, k, v, names), names, "_estimators", meta, only)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
