"""The rows stage's cost as a fraction of dense attention (cuDNN, same q / k / v, same run), for launch options and
small source variants of crisp_trt/kernels/rows.py, before changing the shipped kernel.

    python3 scripts/probes/rows_variants.py [--shapes qwen] [--lengths 16k,32k,128k] [--variants base,w8,...]

Every head block-sparse, 16 sampled rows a query block, one sequence. Each variant's scratch is compared with the
base's (max relative difference over entries ≥ 1e-4); variants marked "timing only" compute something else on
purpose (to split the cost: without the exponentials, pass 1 alone) and their difference is not a check. The
`onepass*` rows time the one-pass prototype (rows_onepass.py: a persistent grid of programs-per-SM × SMs programs)
against the same base. Prints a table of rows_kernel ms / cuDNN ms; writes $OUT/rows_variants.json.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch

from crisp_trt.bench.op import SHAPES, dense_fn, median_ms
from crisp_trt.lengths import parse_length
import rows_onepass
from variants import variant_modules

EXP1 = "tl.exp2(x - m_new[:, None])"
EXP2 = "tl.exp2(x - m[:, None])"
HALF = '''@triton.jit
def _ex2h(x):
    """exp2 on the MUFU's f16x2 path (two a instruction)."""
    return tl.inline_asm_elementwise("ex2.approx.f16x2 $0, $1;", "=r,r", [x.to(tl.float16)], dtype=tl.float16,
                                     is_pure=True, pack=2)


@triton.jit
def _sum_dot(p, BLOCK: tl.constexpr):
    """Row sums of p [RM, BLOCK] f16 on the tensor cores (a dot with ones), f32."""
    return tl.max(tl.dot(p, tl.full([BLOCK, 16], 1.0, tl.float16)), 1)


@triton.jit
def _row_stats('''
FAST_EXP = [("@triton.jit\ndef _row_stats(", HALF),
            (f"tl.sum({EXP1}, 1)", "tl.sum(_ex2h(x - m_new[:, None]).to(tl.float32), 1)"),
            (f"tl.sum({EXP2}, 1)", "tl.sum(_ex2h(x - m[:, None]).to(tl.float32), 1)")]
FAST_DOT = [("@triton.jit\ndef _row_stats(", HALF),
            (f"tl.sum({EXP1}, 1)", "_sum_dot(_ex2h(x - m_new[:, None]), BLOCK)"),
            (f"tl.sum({EXP2}, 1)", "_sum_dot(_ex2h(x - m[:, None]), BLOCK)")]
VARIANTS = {  # name: (substitutions, num_warps, num_stages, timing only)
    "base": ([], None, None, False),
    "w8": ([], 8, None, False),
    "s2": ([], None, 2, False),
    "s4": ([], None, 4, False),
    "w8s2": ([], 8, 2, False),
    "forward": ([("g = tl.num_programs(0) - 1 - tl.program_id(0)", "g = tl.program_id(0)")], None, None, False),
    "f16exp": (FAST_EXP, None, None, False),
    "f16exp_w8": (FAST_EXP, 8, None, False),
    "f16dot": (FAST_DOT, None, None, False),
    "f16dot_w8": (FAST_DOT, 8, None, False),
    "noexp": ([(EXP1, "(x - m_new[:, None])"), (EXP2, "(x - m[:, None])")], None, None, True),
    "pass1": ([("    for kb in range(lo, hi):\n        x = _logits(q, k_ptr, k_start, kb, pos, last, qk_scale, hk, HK, "
                "BLOCK, D, MASKED)\n        per_row",
                "    for kb in range(lo, lo):\n        x = _logits(q, k_ptr, k_start, kb, pos, last, qk_scale, hk, HK, "
                "BLOCK, D, MASKED)\n        per_row")], None, None, True),
}
ONEPASS = {"onepass": (4, 1), "onepass_2x": (4, 2), "onepass_w8": (8, 1)}  # name: (num_warps, programs per SM)


def main() -> None:
    from crisp_trt.kernels.launch import ROWS_TILE, options

    args, mods = variant_modules("rows", __doc__, VARIANTS, "qwen", "16k,32k,128k")
    results, block, r = [], 128, 16
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    timed = list(mods) + list(ONEPASS)
    for shape in args.shapes.split(","):
        heads, kv, d = SHAPES[shape]
        for n in (parse_length(x) for x in args.lengths.split(",")):
            q, k, v = (torch.randn(n, h, d, device="cuda", dtype=torch.bfloat16) for h in (heads, kv, kv))
            cudnn_ms = median_ms(dense_fn("dense_cudnn", q, k, v), args.repeats, "cuda")
            nb = -(-n // block)
            cu = torch.tensor([0, n], dtype=torch.int32, device="cuda")
            route = torch.full((1, heads), 2, dtype=torch.int32, device="cuda")
            base = None
            for name in timed:
                scratch = torch.zeros(1, heads, nb, nb, dtype=torch.float32, device="cuda")
                if name in ONEPASS:
                    warps, per_sm = ONEPASS[name]
                    opts, timing_only = {"num_warps": warps, "num_stages": options("rows", block, d)["num_stages"]}, False
                    slots = torch.empty(per_sm * sms, nb, ROWS_TILE, dtype=torch.float32, device="cuda")

                    def launch():
                        rows_onepass.launch(q, k, cu, cu, route, scratch, slots, 1 / math.sqrt(d), 1024, nb, heads,
                                            heads // kv, block, d, r, ROWS_TILE, per_sm * sms, **opts)
                else:
                    mod = mods[name]
                    _, warps, stages, timing_only = VARIANTS[name]
                    opts = options("rows", block, d)
                    opts = {"num_warps": warps or opts["num_warps"], "num_stages": stages or opts["num_stages"]}

                    def launch():
                        mod.rows_kernel[(-(-(nb * r) // ROWS_TILE), heads, 1)](
                            q, k, cu, cu, route, scratch, 1 / math.sqrt(d), 1024, n, n, heads, heads // kv, nb,
                            BLOCK=block, D=d, R=r, RM=ROWS_TILE, **opts)
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
