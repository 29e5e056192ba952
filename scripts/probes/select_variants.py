"""The select kernel's time for the bisect probes a step (select.PROBES) and, in rows mode, for the rows a program
(QR) and the key blocks a chunk (KR), before changing the shipped kernel.

    python3 scripts/probes/select_variants.py [--shapes qwen] [--lengths 32k,128k] [--variants base,p1,...]

Each variant is crisp_trt/kernels/select.py with PROBES substituted (variants.py) and its QR / KR (contract
constants, patched in launch and pipeline for its launches only; rows16_g0.98 alone: the default does not read
them), launched by the pipeline's own
Stages.lists on the same plan inputs (synthetic bf16 q / k; estimate, route and scores run once by the shipped
kernels) under two configs: the default (floor budget: a sampled quantile a row) and rows16_g0.98 (every head
block-sparse, cumulative coverage of the sampled rows' mass: the mass threshold a row). Every P must give the
same lists (bisect finds the same bit pattern): counts and sorted lists are compared with the base's. Time:
median over repeats, as a fraction of dense attention (cuDNN on the same q / k / v, same run). Prints a table;
writes $OUT/select_variants.json.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from crisp_trt import CrispConfig
from crisp_trt.bench.op import SHAPES, dense_fn, median_ms
from crisp_trt.kernels import launch, pipeline
from crisp_trt.lengths import parse_length
from crisp_trt.workloads.synthetic import synthetic_qkv
from variants import variant_modules

SHIPPED = "PROBES = tl.constexpr(4)"
VARIANTS = {"base": ([],), **{f"p{p}": ([(SHIPPED, f"PROBES = tl.constexpr({p})")],) for p in (1, 2, 8, 16)},
            # rows mode: QR 16 / KR 64 as the pooled mode's QG / KC (224 programs at 32k on 132 SMs)
            **{f"qr{qr}_kr{kr}": ([], qr, kr) for qr, kr in ((16, 64), (4, 256), (2, 128), (1, 256))}}
QR, KR = launch.QR, launch.KR  # shipped; a variant's own values are patched in for its launches only, which
# launch._COMPILED (keyed without the fixed constexprs) allows because each variant is its own kernel object
CONFIGS = {"default": CrispConfig(),
           "rows16_g0.98": CrispConfig.sampled_rows(gamma=0.98)}


def _lists(st) -> tuple[torch.Tensor, torch.Tensor]:
    """(counts, each row's list sorted, entries past its count set to -1)."""
    counts = st.counts.clone()
    idx = st.idx.clone()
    idx[torch.arange(idx.shape[-1], device=idx.device) >= counts[..., None]] = -1
    return counts, idx.sort(-1).values


def main() -> None:
    args, mods = variant_modules("select", __doc__, VARIANTS, "qwen", "32k,128k")
    shipped = pipeline.select_kernel
    rows = []
    for shape in args.shapes.split(","):
        heads, kv, d = SHAPES[shape]
        for n in (parse_length(x) for x in args.lengths.split(",")):
            q, k, v = (t[0] for t in synthetic_qkv(n, heads, kv, d, dtype=torch.bfloat16, device="cuda"))
            cudnn_ms = median_ms(dense_fn("dense_cudnn", q, k, v), args.repeats, "cuda")
            cu = torch.tensor([0, n], dtype=torch.int32, device="cuda")
            for cname, cfg in CONFIGS.items():
                st = pipeline.Stages(q, k, cu, n, cfg)
                st.estimate()
                st.route()
                st.scores()
                base = None
                for name, mod in mods.items():
                    _, qr, kr = (*VARIANTS[name], None, None)[:3]
                    if qr is not None and not cfg.rows:
                        continue
                    pipeline.select_kernel = mod.select_kernel
                    pipeline.QR = launch.QR = qr or QR
                    launch.KR = kr or KR
                    try:
                        ms = median_ms(st.lists, args.repeats, "cuda")
                    except Exception as e:  # a variant Triton cannot compile here is reported, not fatal
                        rows.append(dict(shape=shape, n=n, config=cname, variant=name, error=str(e)[:300]))
                        print(f"{shape} {n} {cname} {name}: FAILED {str(e)[:200]}", flush=True)
                        continue
                    finally:
                        pipeline.select_kernel, pipeline.QR, launch.QR, launch.KR = shipped, QR, QR, KR
                    got = _lists(st)
                    base = got if base is None else base
                    diff = int((got[0] != base[0]).sum() + (got[1] != base[1]).sum())
                    rows.append(dict(shape=shape, n=n, config=cname, variant=name, ms=ms, cudnn_ms=cudnn_ms,
                                     fraction_of_dense=ms / cudnn_ms, mean_count=float(got[0].float().mean()),
                                     diff_base=diff))
                    print(f"{shape} {n} {cname} {name}: {ms:.3f} ms = {ms / cudnn_ms:.4f} of cuDNN "
                          f"({cudnn_ms:.3f} ms), {diff} entries off the base", flush=True)
                del st
    out = Path(os.environ.get("OUT", "/tmp"))
    (out / "select_variants.json").write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": rows},
                                                         indent=1))
    print(f"\nselect / cuDNN (entries off the base)\n{'shape':<7}{'n':>7} {'config':<13}"
          + " ".join(f"{v:>14}" for v in mods))
    for r0 in rows:
        if r0["variant"] != "base":
            continue
        key = (r0["shape"], r0["n"], r0["config"])
        got = {r["variant"]: r for r in rows if (r["shape"], r["n"], r["config"]) == key}
        print(f"{r0['shape']:<7}{r0['n']:>7} {r0['config']:<13}" + " ".join(
            f"{'-':>14}" if v not in got else f"{'fail':>14}" if "ms" not in got[v]
            else f"{got[v]['fraction_of_dense']:>8.4f} ({got[v]['diff_base']:>3})" for v in mods))


if __name__ == "__main__":
    main()
