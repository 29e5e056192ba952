"""Fit one layer class (argv[1]) to the 3-window per-layer statistics; writes fit_<class>.json."""
import json, sys, time
from crisp_trt.workloads.mixture import CLASS_LAYERS, fit_classes
raw = json.load(open("bench/results/session7_mixture/per_layer_windows.json"))
offs = list(raw)
per = {int(l): {int(n): {k: sum(raw[o][l][n][k] for o in offs) / len(offs) for k in raw[offs[0]][l][n]}
                for n in raw[offs[0]][l]} for l in raw[offs[0]]}
json.dump({str(l): {str(n): v for n, v in d.items()} for l, d in per.items()},
          open("bench/results/session7_mixture/per_layer_mean.json", "w"))
name = sys.argv[1]
t = time.time()
rec = fit_classes(per, {name: CLASS_LAYERS[name]}, extrapolate=(32768, 131072), validate=())
print(f"{time.time()-t:.0f}s", flush=True)
json.dump(rec, open(f"bench/results/session7_mixture/fit_{name}.json", "w"), indent=1)
