"""Two-class fit: early layers (0-8) and late layers (9-29) of SmolLM2, each through fit_length_law."""
import json, time
from dataclasses import asdict
from crisp_trt.workloads.fit import fit_length_law
raw = json.load(open("bench/results/session6_mixture/per_layer.json"))
classes = {"early": range(0, 9), "late": range(9, 30)}
out = {}
for name, layers in classes.items():
    t = time.time()
    real = {}
    for n in (1024, 2048, 4096, 8192):
        per = [raw[str(l)][str(n)] for l in layers]
        real[n] = {key: sum(p[key] for p in per) / len(per) for key in per[0]}
    spec, law, se, goals = fit_length_law(real)
    out[name] = {"spec": asdict(spec), "law_128k": law.shares_at(131072), "law_512k": law.shares_at(524288),
                 "real_8k": {k: real[8192][k] for k in ("sink_share", "local_share", "top_share", "background_share", "floor")}}
    print(name, f"{time.time()-t:.0f}s", json.dumps(out[name]), flush=True)
json.dump(out, open("bench/results/session6_mixture/fit2.json", "w"), indent=1)
