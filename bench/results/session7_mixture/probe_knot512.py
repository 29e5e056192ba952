"""Add the 512k knot to a class fitted to 128k (fit_<class>.json of probe_fit.py): next_knot from the 128k
knot, exactly the step fit_knots takes with extrapolate=(32k, 128k, 512k); then check 512k. Writes
knots_<class>.json."""
import json, math, sys, time
from dataclasses import asdict
from crisp_trt.workloads.fit import check_fit, near_law, next_knot
from crisp_trt.workloads.mixture import CLASS_LAYERS, LayerClass, class_means
from crisp_trt.workloads.synthetic import SyntheticSpec
name = sys.argv[1]
rec = json.load(open(f"bench/results/session7_mixture/fit_{name}.json"))["classes"][0]
raw = json.load(open("bench/results/session7_mixture/per_layer_mean.json"))
per = {int(l): {int(n): v for n, v in d.items()} for l, d in raw.items()}
real = class_means(per, CLASS_LAYERS[name])
law = SyntheticSpec(**rec["law"])
near, slope, _ = near_law(real)
goal = lambda n: {**law.shares_at(n), "near_share": min(max(near + slope * math.log2(n / 8192), 0.01), 0.99)}
knots = [SyntheticSpec(**k) for k in rec["knots"]]
t = time.time()
knots.append(next_knot(goal(524288), 524288, (goal(131072), knots[-1]), refine=6))
print(name, "knot", f"{time.time()-t:.0f}s", flush=True)
cls = LayerClass(name, len(CLASS_LAYERS[name]), tuple(knots))
rows = check_fit(cls.spec_at, {524288: goal(524288)}, law, real, validate=(), label=name)
rec["knots"] = [asdict(k) for k in knots]
rec["lengths"].update(rows)
json.dump(rec, open(f"bench/results/session7_mixture/knots_{name}.json", "w"), indent=1)
