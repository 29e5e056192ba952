"""Attend's rate against cuDNN for launch options and small source variants, before changing the shipped kernel.

    python3 scripts/probes/attend_variants.py [--shapes qwen,llama3_8b] [--lengths 16k,32k,128k]

Each variant is crisp_trt/kernels/attend.py with a few textual substitutions (each must match, so an edit of
the kernel fails the probe instead of silently timing the original) and its own num_warps / num_stages,
compiled from a temporary copy. Two plans per (shape, n): every causal block listed (the dense-equivalent
config, kappa 0) and a random half of the off-diagonal blocks (ascending lists, the diagonal always). Rate =
blocks computed per ms against cuDNN's causal blocks per ms (SDPA's cuDNN backend, same q/k/v, same run);
the base variant's output is checked against cuDNN's (all blocks listed) and every other variant's against the
base's. Each timing covers LAUNCHES back-to-back launches per event pair (Triton's launcher costs host time
the shipped cached launch does not), divided. `pointers` / `tma*` force attend's TMA constexpr off / on (the
others follow launch.tma). Prints a table; writes $OUT/attend_variants.json.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch
import triton

from crisp_trt.bench.op import SHAPES, dense_fn, median_ms
from crisp_trt.lengths import parse_length
from variants import variant_modules

FORWARD = [("    qb = NQB - 1 - tl.program_id(0)", "    qb = tl.program_id(0)")]  # the shipped order is reversed
WS = [("for i in tl.range(0, count):", "for i in tl.range(0, count, warp_specialize=True):")]
LAUNCHES = 5
VARIANTS = {  # name: (substitutions, num_warps, num_stages, TMA: None = launch.tma's rule, or forced on / off)
    "base": ([], None, None, None),
    "w4s3": ([], 4, 3, None),
    "w4s4": ([], 4, 4, None),
    "w8s2": ([], 8, 2, None),
    "w8s3": ([], 8, 3, None),
    "forward": (FORWARD, None, None, None),
    "forward_w4s3": (FORWARD, 4, 3, None),
    "ws_w4s2": (WS, 4, 2, None),
    "pointers": ([], None, None, False),
    "tma": ([], None, None, True),
    "tma_w4s3": ([], 4, 3, True),
    "tma_w8s3": ([], 8, 3, True),
    "tma_ws": (WS, None, None, True),
    "tma_ws_w4s2": (WS, 4, 2, True),
}


def lists(nb: int, heads: int, fraction: float, seed: int = 0):
    """idx [1, H, nb, nb] int32, counts [1, H, nb]: every earlier block (fraction 1) or a random share."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.zeros(1, heads, nb, max(nb, 1), dtype=torch.int32)
    counts = torch.zeros(1, heads, nb, dtype=torch.int32)
    for qb in range(nb):
        if fraction >= 1:
            chosen = torch.arange(qb).expand(heads, qb)
        else:
            take = round(fraction * qb)
            chosen = torch.rand(heads, qb, generator=g).argsort(-1)[:, :take].sort(-1).values
        idx[0, :, qb, :chosen.shape[1]] = chosen.int()
        counts[0, :, qb] = chosen.shape[1]
    return idx.cuda(), counts.cuda()


def main() -> None:
    from crisp_trt.kernels.launch import arch_of, options, tma

    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))  # TMA
    args, mods = variant_modules("attend", __doc__, VARIANTS, "qwen,llama3_8b", "16k,32k,128k")
    rows, block = [], 128
    for shape in args.shapes.split(","):
        heads, kv, d = SHAPES[shape]
        for n in (parse_length(x) for x in args.lengths.split(",")):
            q, k, v = (torch.randn(n, h, d, device="cuda", dtype=torch.bfloat16) for h in (heads, kv, kv))
            cudnn = dense_fn("dense_cudnn", q, k, v)
            cudnn_ms = median_ms(cudnn, args.repeats, "cuda")
            dense_out = cudnn().float()
            nb = -(-n // block)
            causal_blocks = nb * (nb + 1) / 2
            cu = torch.tensor([0, n], dtype=torch.int32, device="cuda")
            dense = torch.zeros(1, dtype=torch.int32, device="cuda")
            for fraction in (1.0, 0.5):
                idx, counts = lists(nb, heads, fraction)
                blocks = float(counts.sum()) / heads + nb
                ref = None
                for name, mod in mods.items():
                    _, warps, stages, forced = VARIANTS[name]
                    use_tma = tma(block, d, arch_of(q)) if forced is None else forced
                    opts = options("attend", block, d)
                    opts = {"num_warps": warps or opts["num_warps"], "num_stages": stages or opts["num_stages"]}
                    out = torch.empty_like(q)
                    lse = torch.empty(0, dtype=torch.float32, device="cuda")

                    def launch():
                        for _ in range(LAUNCHES):
                            mod.attend_kernel[(nb, heads, 1)](q, k, v, out, lse, cu, cu, idx, counts, dense,
                                                              1 / math.sqrt(d), n, n, 0, heads, heads // kv, nb,
                                                              idx.shape[-1], BLOCK=block, D=d, INTERPRET=False,
                                                              TMA=use_tma, **opts)
                    try:
                        ms = median_ms(launch, args.repeats, "cuda") / LAUNCHES
                    except Exception as e:  # a variant Triton cannot compile here is reported, not fatal
                        rows.append(dict(shape=shape, n=n, fraction=fraction, variant=name, error=str(e)[:200]))
                        print(f"{shape} {n} {fraction} {name}: FAILED {str(e)[:120]}", flush=True)
                        continue
                    if ref is None:  # the base: against cuDNN when every block is listed
                        ref = out.clone()
                        diff = float((out.float() - dense_out).abs().max()) if fraction == 1.0 else 0.0
                    else:
                        diff = float((out.float() - ref.float()).abs().max())
                    rate = (blocks / ms) / (causal_blocks / cudnn_ms)
                    rows.append(dict(shape=shape, n=n, fraction=fraction, variant=name, ms=ms, cudnn_ms=cudnn_ms,
                                     rate_vs_cudnn=rate, max_diff=diff, tma=use_tma, **opts))
                    print(f"{shape} {n} {fraction} {name}: {ms:.3f} ms, rate {rate:.3f}x cuDNN, max |diff| {diff:.2g}",
                          flush=True)
    out_dir = Path(os.environ.get("OUT", "/tmp"))
    (out_dir / "attend_variants.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": rows},
                                                             indent=1))
    print(f"\n{'shape':<10}{'n':>7}{'frac':>5} " + " ".join(f"{v[:12]:>12}" for v in mods))
    for shape in args.shapes.split(","):
        for n in sorted({r["n"] for r in rows}):
            for fraction in (1.0, 0.5):
                got = {r["variant"]: r.get("rate_vs_cudnn") for r in rows
                       if r["shape"] == shape and r["n"] == n and r["fraction"] == fraction}
                print(f"{shape:<10}{n:>7}{fraction:>5} " + " ".join(
                    f"{got[v]:>12.3f}" if got.get(v) else f"{'fail':>12}" for v in mods))


if __name__ == "__main__":
    main()
