"""Do the two class specs reproduce their classes' real statistics at 1k-8k (fit.within_tolerance)?"""
import json
from crisp_trt.workloads.fit import synthetic_stats, within_tolerance, STATS, near_share
from crisp_trt.workloads.synthetic import SyntheticSpec
raw = json.load(open("bench/results/session6_mixture/per_layer.json"))
fit = json.load(open("bench/results/session6_mixture/fit2.json"))
for name, layers in {"early": range(0, 9), "late": range(9, 30)}.items():
    spec = SyntheticSpec(**fit[name]["spec"])
    for n in (1024, 2048, 4096, 8192):
        per = [raw[str(l)][str(n)] for l in layers]
        real = {key: sum(p[key] for p in per) / len(per) for key in per[0]}
        syn = synthetic_stats(spec, n, head_dim=64)
        print(name, n, "ok" if within_tolerance(real, syn) else "OUT",
              " ".join(f"{s}={real[s]:.3f}/{syn[s]:.3f}" for s in STATS), f"near={near_share(real):.2f}/{near_share(syn):.2f}", flush=True)
