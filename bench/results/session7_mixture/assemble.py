"""Assemble fitted_smollm2_classes.json from this session's per-class runs, in mixture.fit_classes' record
format: each class fitted to 128k (probe_fit.py), its end segment checked at 512k (probe_check512.py for
late; in fit_early.json for early): both missed their law there, so 512k is a knot (probe_knot512.py,
knots_<class>.json) exactly as fit_classes adds one."""
import json
from crisp_trt.workloads.fit import TOLERANCE
from crisp_trt.workloads.mixture import CLASSES_PATH
d = "bench/results/session7_mixture/"
early = json.load(open(d + "knots_early.json"))
late = json.load(open(d + "knots_late.json"))
classes = [early, late]
record = {"tolerance": TOLERANCE, "classes": classes,
          "tolerance_met": all(r["within_tolerance"] for c in classes for r in c["lengths"].values()),
          "source": "SmolLM2-135M-Instruct Q4_1 GGUF, post-RoPE Q/K, every layer, real text of "
                    "/usr/share/common-licenses from tokens 0, 12000, 24000 (first n tokens), last 128 query "
                    "rows, all 9 heads; class = mean over its layers and the windows"}
print({c["name"]: {n: r["within_tolerance"] for n, r in c["lengths"].items()} for c in classes})
assert record["tolerance_met"]
json.dump(record, open(CLASSES_PATH, "w"), indent=1)
