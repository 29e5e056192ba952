"""Per-kernel GPU time of one CRISP op call (plan, attend, input poison; torch.profiler): which stage dominates.

    python3 scripts/probes/profile_plan.py [n ...]     # default 131072; Llama-3-8B shape, synthetic, bf16
    SHAPE=smollm2 python3 scripts/probes/profile_plan.py 8192   # SmolLM2's 9 / 3 heads, d = 64
    SPIKE=0 SHAPE=qwen python3 scripts/probes/profile_plan.py 16384 32768   # without select's spike stage
    CONFIG='{"rows": 16, "tau": 1.5}' SHAPE=qwen python3 scripts/probes/profile_plan.py 32768   # CrispConfig fields
    OPTIONS="shipped;route=1;estimate_mass=4/2" python3 scripts/probes/profile_plan.py 8192   # launch options

Prints, per n, each kernel's mean time over 5 runs, its share, and its fraction of dense attention (cuDNN SDPA on
the same inputs, timed in the same run); writes
$OUT/profile_<shape>_<n>[_nospike][_rows<R>][_<setting>].json. OPTIONS lists settings separated by ";", each "shipped"
or comma-separated stage=num_warps[/num_stages] overrides of launch.options (a measurement before changing the
launch rule); every setting's plan (list lengths, keep maps, routes) is checked equal to the first's and its
C_struct gap printed (launch options change only the order of float sums). PLAN_DIR=dir saves each plan there
(torch.save, named like the JSON) to compare two versions of the kernels run on the same seeded inputs.
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from crisp_trt import CrispConfig
from crisp_trt.bench.op import SHAPES, dense_fn, median_ms
from crisp_trt.kernels import aot, launch
from crisp_trt.kernels.pipeline import Stages
from crisp_trt.workloads.synthetic import synthetic_qkv

SHAPE = os.environ.get("SHAPE", "llama3_8b")
H, HKV, D = SHAPES[SHAPE]
RUNS = 5
CONFIG = CrispConfig.from_dict({**CrispConfig().to_dict(), **json.loads(os.environ.get("CONFIG", "{}")),
                                **({"spike": float(os.environ["SPIKE"])} if "SPIKE" in os.environ else {})})


SHIPPED = launch.options
STAGES = tuple(aot.KERNELS)  # every kernel's stage name (launch.name)
PLAN = tuple(s for s in STAGES if s != "attend" and not s.startswith("poison"))  # estimate → route → select


def override(setting: str) -> None:
    """Launch with `setting`'s options ("shipped", or "stage=warps[/stages],...") from now on."""
    over = {}
    for item in [] if setting == "shipped" else filter(None, setting.split(",")):
        stage, _, value = item.partition("=")
        warps, _, stages = value.partition("/")
        if stage.strip() not in STAGES or not warps.isdigit() or not (stages.isdigit() or stages == ""):
            raise SystemExit(f"OPTIONS: {item!r}: expected stage=warps[/stages] with a stage in {', '.join(STAGES)}")
        over[stage.strip()] = {"num_warps": int(warps), **({"num_stages": int(stages)} if stages else {})}
    launch.options = lambda stage, *a, **kw: {**SHIPPED(stage, *a, **kw), **over.get(stage, {})}
    launch._COMPILED.clear()


def kernel_times(n: int, cfg: CrispConfig, name: str) -> tuple[float, float, dict[str, float], tuple]:
    """(wall ms per call, cuDNN's ms, {kernel: mean GPU ms per call}, the plan: list lengths, keep maps, routes,
    C_struct)."""
    q, k, v = (t[0] for t in synthetic_qkv(n, H, HKV, D, dtype=torch.bfloat16, device="cuda"))
    dense_ms = median_ms(dense_fn("dense_cudnn", q, k, v), RUNS, "cuda")
    cu = torch.tensor([0, n], dtype=torch.int32, device="cuda")
    st = Stages(q, k, cu, n, cfg)

    def once():  # what crisp_cuda launches
        st.plan()
        st.attend(v)

    once()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(RUNS):
            once()
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(20):
        once()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - start) / 20 * 1e3  # host + device, synchronised
    times = {}
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" and e.device_time_total > 0:
            times[e.key[:60]] = e.device_time_total / RUNS / 1e3
    plan = tuple(t.clone() for t in (st.ncols, st.ndists, st.counts, st.columns, st.distances, st.route_, st.c_struct))
    if os.environ.get("PLAN_DIR"):  # to compare two versions of the kernels: the same synthetic inputs each run
        os.makedirs(os.environ["PLAN_DIR"], exist_ok=True)
        torch.save([t.cpu() for t in plan], os.path.join(os.environ["PLAN_DIR"], f"{name}.pt"))
    return wall, dense_ms, dict(sorted(times.items(), key=lambda kv: -kv[1])), plan


def main() -> None:
    lengths = [int(a) for a in sys.argv[1:]] or [131072]
    out = os.environ.get("OUT", "/tmp/crisp_profile")
    os.makedirs(out, exist_ok=True)
    settings = [v.strip() for v in os.environ.get("OPTIONS", "shipped").split(";") if v.strip()]
    for n in lengths:
        first = None
        for setting in settings:
            override(setting)
            tag = "" if setting == "shipped" else "_" + setting.replace("=", "").replace("/", "s").replace(",", "_")
            rows = f"_rows{CONFIG.rows}" if CONFIG.rows else ""
            name = f"profile_{SHAPE}_{n}{'' if CONFIG.spike else '_nospike'}{rows}{tag}"
            wall, dense_ms, times, plan = kernel_times(n, CONFIG, name)
            first = first or plan
            same = all(torch.equal(a, b) for a, b in zip(first[:-1], plan[:-1]))
            c_gap = (first[-1] - plan[-1]).abs().max().item()
            with open(os.path.join(out, f"{name}.json"), "w") as f:
                json.dump({"n": n, "shape": SHAPE, "spike": CONFIG.spike, "config": CONFIG.to_dict(),
                           "device": torch.cuda.get_device_name(),
                           "options": setting, "plan_equal_to_first": same, "c_struct_gap": c_gap, "wall_ms": wall,
                           "dense_cudnn_ms": dense_ms, "ms": times}, f, indent=1)
            stages = {k.removesuffix("_kernel"): ms for k, ms in times.items() if k.removesuffix("_kernel") in PLAN}
            print(f"{SHAPE} n={n} {setting:<28} plan {sum(stages.values()):.4f} ms, "
                  + ", ".join(f"{k} {ms:.4f}" for k, ms in stages.items())
                  + f"; plan equal to first: {same}, C_struct gap {c_gap:.1e}")
        override("shipped")
        total = sum(times.values())  # the last setting's
        print(f"{SHAPE} n={n} {setting}: {total:.2f} ms of kernels per plan + attend, {wall:.2f} ms wall per call; "
              f"cuDNN {dense_ms:.2f} ms: kernels {dense_ms / total:.2f}x, wall {dense_ms / wall:.2f}x")
        for name, ms in times.items():
            print(f"  {ms:9.3f} ms {100 * ms / total:5.1f}% {ms / dense_ms:6.3f} of dense  {name}")


if __name__ == "__main__":
    main()
