"""Check a class fitted to 128k (fit_<class>.json) at 512k against its law, extrapolating along the end
segment (no 512k knot). Writes check512_<class>.json."""
import json, math, sys
from crisp_trt.workloads.fit import check_fit
from crisp_trt.workloads.mixture import CLASS_LAYERS, class_means, fitted_classes
from crisp_trt.workloads.synthetic import SyntheticSpec
name = sys.argv[1]
path = f"bench/results/session7_mixture/fit_{name}.json"
(cls,) = fitted_classes(path)
rec = json.load(open(path))["classes"][0]
raw = json.load(open("bench/results/session7_mixture/per_layer_mean.json"))
real = class_means({int(l): {int(n): v for n, v in d.items()} for l, d in raw.items()}, CLASS_LAYERS[name])
law = SyntheticSpec(**rec["law"])
rows = check_fit(cls.spec_at, {}, law, real, validate=(524288,), label=name)
json.dump(rows, open(f"bench/results/session7_mixture/check512_{name}.json", "w"), indent=1)
