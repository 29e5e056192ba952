"""How much of attend's time a launch order loses to its last wave, on a real model's lists (CPU, no GPU needed).

    python3 scripts/probes/attend_schedule.py [--lists bench/results/latest/probes/attend_real/lists_...pt]
        [--slots 264] [--overhead 2]

A model of the GPU's block scheduler: `slots` resident programs (H100: 132 SMs × 2 attend CTAs), each free slot
takes the next program in launch order (x fastest), and a program costs `overhead` + its listed blocks (the Q load,
the masked diagonal and the store, in listed-block units). Efficiency = the work / (slots × makespan). Orders:
heads_outer (attend's grid before session 27: a head's query blocks latest first, one head after another),
heads_inner (the shipped grid: a row's heads together, latest rows first), lpt (largest count first), and uniform
lists (each row the same share of its causal blocks) in the shipped order. attend_real.py times the same orders on
the GPU; this says what to expect from scheduling alone.
"""
from __future__ import annotations

import argparse
import heapq
import json
import os
from pathlib import Path

import torch

from attend_real import orders, uniform_counts, unpack

LISTS = Path(__file__).resolve().parents[2] / "bench/results/latest/probes/attend_real/lists_32768_code_calib_reference.pt"


def makespan(costs, slots: int) -> float:
    """Finish time of programs taken in order by the first free of `slots` slots."""
    free = [0.0] * slots
    for cost in costs:
        heapq.heapreplace(free, free[0] + cost)
    return max(free)


def efficiencies(counts: torch.Tensor, slots: int, overhead: float) -> dict:
    """counts [H, NB] of one layer → {order: efficiency} (see the module doc); the orders and the uniform lists are
    attend_real's."""
    counts = counts[None].int()
    runs = {how: counts.reshape(-1)[orders(counts, how).view(torch.int32).long()]
            for how in ("heads_outer", "heads_inner", "lpt")}
    uniform = uniform_counts(counts, counts.shape[-1])
    runs["uniform"] = uniform.reshape(-1)[orders(uniform, "heads_inner").view(torch.int32).long()]
    out = {}
    for name, order in runs.items():
        costs = (order.double() + overhead).tolist()
        out[name] = sum(costs) / (slots * makespan(costs, slots))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lists", default=LISTS, help="a lists_<n>.pt that attend_real.py saved")
    ap.add_argument("--slots", type=int, default=264, help="resident attend programs (SMs × CTAs an SM)")
    ap.add_argument("--overhead", type=float, default=2.0, help="a program's fixed cost, in listed blocks")
    args = ap.parse_args()
    if args.slots < 1 or args.overhead < 0:
        raise SystemExit(f"--slots {args.slots} / --overhead {args.overhead}: expected ≥ 1 / ≥ 0")
    if not Path(args.lists).is_file():
        raise SystemExit(f"--lists {args.lists}: no such file; expected a lists_<n>.pt that attend_real.py saved")
    saved = torch.load(args.lists)
    nb = -(-saved["n"] // saved["config"]["block_size"])
    rows, work, total = [], {}, 0.0
    for layer, bits in saved["lists"].items():
        counts = unpack(bits, nb).tril(-1).sum(-1)
        eff = efficiencies(counts, args.slots, args.overhead)
        weight = float(counts.sum()) + args.overhead * counts.numel()
        total += weight
        for name, e in eff.items():
            work[name] = work.get(name, 0.0) + weight / e
        rows.append({"layer": layer, "density": float(counts.sum() + counts.numel()) / (counts.shape[0] * nb * (nb + 1) / 2),
                     **eff})
    summed = {name: total / t for name, t in work.items()}
    out = Path(os.environ.get("OUT", "/tmp")) / "attend_schedule.json"
    out.write_text(json.dumps({"lists": str(args.lists), "slots": args.slots, "overhead": args.overhead, "rows": rows,
                               "summed": summed}, indent=1))
    names = list(summed)
    print(f"efficiency of each launch order ({args.slots} slots, overhead {args.overhead} blocks a program; {out})")
    print(f"{'layer':>6}{'density':>9}" + "".join(f"{n:>13}" for n in names))
    for r in rows:
        print(f"{r['layer']:>6}{r['density']:>9.3f}" + "".join(f"{r[n]:>13.3f}" for n in names))
    print(f"{'all':>6}{'':>9}" + "".join(f"{summed[n]:>13.3f}" for n in names))


if __name__ == "__main__":
    main()
