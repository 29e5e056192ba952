"""Assemble fitted_smollm2_classes.json from this session's per-class runs, in mixture.fit_classes' record
format. Each class was fitted to 128k (probe_fit.py) and its end segment checked at 512k against its law
(in fit_early.json; probe_check512.py for late): both missed there. Early got its 512k knot
(probe_knot512.py, knots_early.json, 28 min); late's finished in session 8 (knots_late.json, 54 min), so both
classes reach 512k. (Until then late stopped at 128k, its failed 512k check kept as "past_last_knot".)"""
import json
from crisp_trt.workloads.fit import TOLERANCE
from crisp_trt.workloads.mixture import CLASSES_PATH
d = "bench/results/session7_mixture/"
early = json.load(open(d + "knots_early.json"))
late = json.load(open(d + "knots_late.json"))  # session 8: its 512k knot (probe_knot512.py late, 54 min)
classes = [early, late]
record = {"tolerance": TOLERANCE, "classes": classes,
          "tolerance_met": all(r["within_tolerance"] for c in classes for r in c["lengths"].values()),
          "source": "SmolLM2-135M-Instruct Q4_1 GGUF, post-RoPE Q/K, every layer, real text of "
                    "/usr/share/common-licenses from tokens 0, 12000, 24000 (first n tokens), last 128 query "
                    "rows, all 9 heads; class = mean over its layers and the windows"}
print({c["name"]: {n: r["within_tolerance"] for n, r in c["lengths"].items()} for c in classes})
assert record["tolerance_met"]
json.dump(record, open(CLASSES_PATH, "w"), indent=1)
