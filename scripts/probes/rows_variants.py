"""The rows stage's cost as a fraction of dense attention (cuDNN, same q / k / v, same run), for launch options and
small source variants of crisp_trt/kernels/rows.py, before changing the shipped kernel.

    python3 scripts/probes/rows_variants.py [--shapes qwen] [--lengths 16k,32k,128k] [--variants base,w8,...]

Every head block-sparse, 16 sampled rows a query block, one sequence. Each variant's scratch is compared with the
base's (max relative difference over entries ≥ 1e-4); variants marked "timing only" compute something else on
purpose (without the exponentials, to split the cost) and their difference is not a check. `x2` / `x3` / `x6` /
`x8` run the base with that many persistent programs per SM (the base: contract RS); `twopass*` the two-pass form
(rows_twopass.py) on the same inputs. Prints a table of rows_kernel ms / cuDNN ms; writes $OUT/rows_variants.json.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch

from crisp_trt.bench.op import SHAPES, dense_fn, median_ms
from crisp_trt.lengths import parse_length
import rows_twopass
from variants import variant_modules

EXP = "tl.exp2(x - m_new[:, None])"
HALF = '''@triton.jit
def _ex2h(x):
    """exp2 on the MUFU's f16x2 path (two exponentials an instruction)."""
    return tl.inline_asm_elementwise("ex2.approx.f16x2 $0, $1;", "=r,r", [x.to(tl.float16)], dtype=tl.float16,
                                     is_pure=True, pack=2)


@triton.jit
def _sum_dot(p, BLOCK: tl.constexpr):
    """Row sums of p [RM, BLOCK] f16 on the tensor cores (a dot with ones), f32."""
    return tl.max(tl.dot(p, tl.full([BLOCK, 16], 1.0, tl.float16)), 1)


@triton.jit
def _blocks_lse('''
FAST_EXP = [("@triton.jit\ndef _blocks_lse(", HALF),
            (f"tl.sum({EXP}, 1)", "tl.sum(_ex2h(x - m_new[:, None]).to(tl.float32), 1)")]
FAST_DOT = [("@triton.jit\ndef _blocks_lse(", HALF),
            (f"tl.sum({EXP}, 1)", "_sum_dot(_ex2h(x - m_new[:, None]), BLOCK)")]
VARIANTS = {  # name: (substitutions, num_warps, num_stages, timing only)
    "base": ([], None, None, False),
    "w8": ([], 8, None, False),
    "s2": ([], None, 2, False),
    "s4": ([], None, 4, False),
    "w8s2": ([], 8, 2, False),
    "f16exp": (FAST_EXP, None, None, False),
    "f16exp_w8": (FAST_EXP, 8, None, False),
    "f16dot": (FAST_DOT, None, None, False),
    "f16dot_w8": (FAST_DOT, 8, None, False),
    "noexp": ([(EXP, "(x - m_new[:, None])")], None, None, True),
}
PROGRAMS = {"x2": 2, "x3": 3, "x6": 6, "x8": 8}  # the base with this many programs per SM (base: RS)
TWO_PASS = ("twopass", "twopass_w8")  # rows_twopass.py, 4 / 8 warps


def main() -> None:
    from crisp_trt.kernels.launch import ROWS_PROGRAMS, ROWS_TILE, fixed, options

    args, mods = variant_modules("rows", __doc__, VARIANTS, "qwen", "16k,32k,128k")
    results, block, r = [], 128, 16
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    timed = list(mods) + list(PROGRAMS) + list(TWO_PASS)
    for shape in args.shapes.split(","):
        heads, kv, d = SHAPES[shape]
        for n in (parse_length(x) for x in args.lengths.split(",")):
            q, k, v = (torch.randn(n, h, d, device="cuda", dtype=torch.bfloat16) for h in (heads, kv, kv))
            cudnn_ms = median_ms(dense_fn("dense_cudnn", q, k, v), args.repeats, "cuda")
            nb = -(-n // block)
            tiles = -(-(nb * r) // ROWS_TILE) * heads
            cu = torch.tensor([0, n], dtype=torch.int32, device="cuda")
            route = torch.full((1, heads), 2, dtype=torch.int32, device="cuda")
            base = None
            for name in timed:
                scratch = torch.zeros(1, heads, nb, nb, dtype=torch.float32, device="cuda")
                mod = mods.get(name, mods["base"])
                _, warps, stages, timing_only = VARIANTS.get(name, ([], 8 if name.endswith("w8") else None, None,
                                                                    False))
                opts = options("rows", block, d)
                opts = {"num_warps": warps or opts["num_warps"], "num_stages": stages or opts["num_stages"]}
                programs = min(tiles, PROGRAMS[name] * sms if name in PROGRAMS else ROWS_PROGRAMS)
                slots = torch.empty(programs, nb, ROWS_TILE, dtype=torch.float32, device="cuda")

                def launch():
                    if name in TWO_PASS:
                        rows_twopass.launch(q, k, cu, route, scratch, 1 / math.sqrt(d), 1024, nb, heads, heads // kv,
                                            block, d, r, ROWS_TILE, **opts)
                    else:
                        mod.rows_kernel[(programs, 1, 1)](
                            q, k, cu, cu, route, scratch, slots, 1 / math.sqrt(d), 1024, n, n, 1, heads, heads // kv,
                            nb, BLOCK=block, D=d, R=r, RM=ROWS_TILE, KC=fixed(block)["KC"], **opts)
                try:
                    ms = median_ms(launch, args.repeats, "cuda")
                except Exception as e:  # a variant Triton cannot compile here is reported, not fatal
                    results.append(dict(shape=shape, n=n, variant=name, error=str(e)[:300]))
                    print(f"{shape} {n} {name}: FAILED {str(e)[:200]}", flush=True)
                    continue
                if base is None:
                    base = scratch.clone()
                big = base >= 1e-4
                diff = float(((scratch - base).abs()[big] / base[big]).max()) if big.any() else 0.0
                if not timing_only and not diff == diff:  # NaN never passes
                    diff = float("inf")
                results.append(dict(shape=shape, n=n, variant=name, ms=ms, cudnn_ms=cudnn_ms,
                                    fraction_of_dense=ms / cudnn_ms, max_rel_diff=diff, timing_only=timing_only,
                                    **opts))
                print(f"{shape} {n} {name}: {ms:.3f} ms = {ms / cudnn_ms:.3f} of cuDNN ({cudnn_ms:.3f} ms), "
                      f"max rel diff {diff:.2g}{' (timing only)' if timing_only else ''}", flush=True)
    out_dir = Path(os.environ.get("OUT", "/tmp"))
    (out_dir / "rows_variants.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": results},
                                                           indent=1))
    print(f"\nrows_kernel / cuDNN\n{'shape':<8}{'n':>7} " + " ".join(f"{v[:10]:>10}" for v in timed))
    for shape in args.shapes.split(","):
        for n in sorted({x["n"] for x in results if x["shape"] == shape}):
            got = {x["variant"]: x.get("fraction_of_dense") for x in results if x["shape"] == shape and x["n"] == n}
            print(f"{shape:<8}{n:>7} " + " ".join(f"{got[v]:>10.3f}" if got.get(v) else f"{'fail':>10}" for v in timed))


if __name__ == "__main__":
    main()
