"""The spike stage's time and flags for launch options and small source variants, before changing the shipped kernel.

    python3 scripts/probes/spike_variants.py [--shapes llama3_8b,qwen] [--lengths 8k,32k,128k] [--variants base,...]

Each variant is crisp_trt/kernels/spike.py with textual substitutions (variants.py) and its own num_warps /
num_stages / KC, launched with the op's arguments on the same pooled keys (the shipped estimate stage's, on
synthetic bf16 q / k, default config; "f32" is session 19's kernel: tf32 dots on the f32 pooled keys). Time:
median over repeats of LAUNCHES back-to-back launches, divided. Flags: every variant's map against
reference.spike_mass (f32) — mismatches and the largest |share − spike| among them (how near the threshold the
disagreement is) — and against the base's. Prints a table; writes $OUT/spike_variants.json.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from crisp_trt import CrispConfig, reference
from crisp_trt.bench.op import SHAPES, median_ms
from crisp_trt.kernels.launch import options
from crisp_trt.kernels.pipeline import Stages
from crisp_trt.lengths import parse_length
from crisp_trt.workloads.synthetic import synthetic_qkv
from variants import variant_modules

F32 = [("mask=valid[:, None], other=0.0)\n", "mask=valid[:, None], other=0.0).to(tl.float32)\n"),  # session 19's:
       ("mask=(kb <= qb)[:, None], other=0.0)", "mask=(kb <= qb)[:, None], other=0.0).to(tl.float32)"),  # tf32 dots
       ("mask=(kb < qb)[:, None], other=0.0)", "mask=(kb < qb)[:, None], other=0.0).to(tl.float32)")]  # on pooled_k
T2 = [("""        z = tl.dot(q, tl.trans(pk)) * sm_scale - lse[:, None]
        z = tl.where(valid[:, None] & (kb < qb)[None, :], z, float("-inf"))
        tl.store(out + kb, (tl.max(z, 0) > log_spike).to(tl.int8), mask=kb < qb)""",
       """        z = tl.dot(pk, tl.trans(q)) * sm_scale - lse[None, :]
        z = tl.where(valid[None, :] & (kb < qb)[:, None], z, float("-inf"))
        tl.store(out + kb, (tl.max(z, 1) > log_spike).to(tl.int8), mask=kb < qb)""")]  # the row max in-warp
REV = [("    qb = tl.program_id(0)", "    qb = NB - 1 - tl.program_id(0)")]  # the longest rows first
LAUNCHES = 5
VARIANTS = {  # name: (substitutions, num_warps, num_stages, KC, f32 pooled keys); base: the shipped kernel
    "base": ([], None, None, 64, False),
    "f32": (F32, None, None, 64, True),
    "w4s3": ([], 4, 3, 64, False),
    "w4s2": ([], 4, 2, 64, False),
    "w8s2": ([], 8, 2, 64, False),
    "kc32": ([], None, None, 32, False),
    "kc128": ([], None, None, 128, False),
    "t2": (T2, None, None, 64, False),
    "rev": (REV, None, None, 64, False),
    "w4s3_kc32": ([], 4, 3, 32, False),
    "t2_kc32": (T2, None, None, 32, False),
    "t2_w4s3": (T2, 4, 3, 64, False),
}


def main() -> None:
    args, mods = variant_modules("spike", __doc__, VARIANTS, "llama3_8b,qwen", "8k,32k,128k")
    cfg, block, rows = CrispConfig(), 128, []
    for shape in args.shapes.split(","):
        heads, kv, d = SHAPES[shape]
        for n in (parse_length(x) for x in args.lengths.split(",")):
            q, k, _ = (t[0] for t in synthetic_qkv(n, heads, kv, d, dtype=torch.bfloat16, device="cuda"))
            cu = torch.tensor([0, n], dtype=torch.int32, device="cuda")
            st = Stages(q, k, cu, n, cfg)
            st.estimate()
            nb, scale, groups, dense_below = st.z.nb, st.scale, st.groups, st.dense_below  # the op's arguments
            mass = reference.spike_mass(q, k, block)  # [H, NB, NB] f32
            want = mass > cfg.spike
            base = None
            for name, mod in mods.items():
                subs, warps, stages, kc, f32 = VARIANTS[name]
                opts = options("spike", block, d)
                opts = {"num_warps": warps or opts["num_warps"], "num_stages": stages or opts["num_stages"]}
                pk = st.pooled_k if f32 else st.pooled_k_in
                spk = torch.zeros(1, heads, nb, nb, dtype=torch.int8, device="cuda")

                def launch():
                    for _ in range(LAUNCHES):
                        mod.spike_kernel[(nb, heads, 1)](q, cu, cu, pk, spk, scale, cfg.spike, dense_below, n, n,
                                                         heads, groups, nb, BLOCK=block, D=d, KC=kc, **opts)
                try:
                    ms = median_ms(launch, args.repeats, "cuda") / LAUNCHES
                except Exception as e:  # a variant Triton cannot compile here is reported, not fatal
                    rows.append(dict(shape=shape, n=n, variant=name, error=str(e)[:200]))
                    print(f"{shape} {n} {name}: FAILED {str(e)[:160]}", flush=True)
                    continue
                got = spk[0].bool()
                wrong = got != want
                near = float((mass - cfg.spike).abs()[wrong].max()) if wrong.any() else 0.0
                base = got if name == "base" else base
                off_base = None if base is None else int((got != base).sum())  # None: the base failed to compile
                row = dict(shape=shape, n=n, variant=name, ms=ms, flagged=int(got.sum()), ref_flagged=int(want.sum()),
                           mismatch_ref=int(wrong.sum()), worst_margin=near, diff_base=off_base, kc=kc, f32=f32, **opts)
                rows.append(row)
                print(f"{shape} {n} {name}: {ms:.3f} ms, flagged {row['flagged']} (ref {row['ref_flagged']}), "
                      f"{row['mismatch_ref']} off the reference (|share - spike| <= {near:.1e}), "
                      f"{row['diff_base']} off the base", flush=True)
            del st, mass, want
    out = Path(os.environ.get("OUT", "/tmp"))
    (out / "spike_variants.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    print(f"\n{'shape':<10}{'n':>7} " + " ".join(f"{v[:15]:>15}" for v in mods) + "   (ms; base first)")
    for shape in args.shapes.split(","):
        for n in sorted({r["n"] for r in rows if r["shape"] == shape}):
            got = {r["variant"]: r.get("ms") for r in rows if r["shape"] == shape and r["n"] == n}
            print(f"{shape:<10}{n:>7} " + " ".join(f"{got[v]:>15.3f}" if got.get(v) else f"{'fail':>15}" for v in mods))


if __name__ == "__main__":
    main()
