"""Per-kernel GPU time of one CRISP op call (plan, attend, input poison; torch.profiler): which stage dominates.

    python3 scripts/probes/profile_plan.py [n ...]     # default 131072; Llama-3-8B shape, synthetic, bf16
    SHAPE=smollm2 python3 scripts/probes/profile_plan.py 8192   # SmolLM2's 9 / 3 heads, d = 64
    SPIKE=0.01 SHAPE=qwen python3 scripts/probes/profile_plan.py 16384 32768   # with select's spike stage

Prints, per n, each kernel's mean time over 5 runs and its share; writes $OUT/profile_<n>.json.
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from crisp_trt import CrispConfig
from crisp_trt.bench.op import SHAPES
from crisp_trt.kernels.pipeline import Stages
from crisp_trt.workloads.synthetic import synthetic_qkv

SHAPE = os.environ.get("SHAPE", "llama3_8b")
H, HKV, D = SHAPES[SHAPE]
RUNS = 5
CONFIG = CrispConfig(spike=float(os.environ.get("SPIKE", "0")))  # SPIKE=0.01: with select's spike stage


def kernel_times(n: int, cfg: CrispConfig) -> tuple[float, dict[str, float]]:
    """(wall ms per call, {kernel: mean GPU ms per call})."""
    q, k, v = (t[0] for t in synthetic_qkv(n, H, HKV, D, dtype=torch.bfloat16, device="cuda"))
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
    return wall, dict(sorted(times.items(), key=lambda kv: -kv[1]))


def main() -> None:
    lengths = [int(a) for a in sys.argv[1:]] or [131072]
    out = os.environ.get("OUT", "/tmp/crisp_profile")
    os.makedirs(out, exist_ok=True)
    for n in lengths:
        wall, times = kernel_times(n, CONFIG)
        with open(os.path.join(out, f"profile_{SHAPE}_{n}{'_spike' if CONFIG.spike else ''}.json"), "w") as f:
            json.dump({"n": n, "shape": SHAPE, "spike": CONFIG.spike, "device": torch.cuda.get_device_name(),
                       "wall_ms": wall,
                       "ms": times}, f, indent=1)
        total = sum(times.values())
        print(f"{SHAPE} n={n}: {total:.2f} ms of kernels per plan + attend, {wall:.2f} ms wall per call")
        for name, ms in times.items():
            print(f"  {ms:9.3f} ms {100 * ms / total:5.1f}%  {name}")


if __name__ == "__main__":
    main()
