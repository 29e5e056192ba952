"""CRISP (reference) on a two-class mixture workload vs the shipped averaged spec, last 1024 rows."""
import json, os, time, types, torch
from crisp_trt import CrispConfig, reference
from crisp_trt.bench.recall import same_budget_oracle
from crisp_trt.kernels.pipeline import lists_from_masks
from crisp_trt.workloads.fit import fitted_spec
from crisp_trt.workloads.synthetic import SyntheticSpec, synthetic_qkv
torch.set_num_threads(2)
D = int(os.environ.get("D", 128))
fit = json.load(open("bench/results/session6_mixture/fit2.json"))
specs = {name: SyntheticSpec(**v["spec"]) for name, v in fit.items()}
def workload(n, kind):
    groups = ["early"] * 2 + ["late"] * 6 if kind == "mixture" else [None] * 8
    parts = [synthetic_qkv(n, 1, 1, D, spec=specs[g] if g else fitted_spec(), seed=10 + i, dtype=torch.bfloat16)
             for i, g in enumerate(groups)]
    q, k, v = (torch.cat([p[j][0] for p in parts], dim=1).float() for j in range(3))
    return q, k, v, groups
for n in [int(x) for x in os.environ.get("NS", "32768").split(",")]:
    for kind in os.environ.get("KINDS", "averaged,mixture").split(","):
        t = time.time()
        q, k, v, groups = workload(n, kind)
        cfg = CrispConfig()
        sel, masks = reference.select_masks(q, k, cfg)
        nb = masks.shape[-1]
        idx, counts = lists_from_masks([masks], nb, nb)
        plan = types.SimpleNamespace(idx=idx, counts=counts, dense=torch.zeros(1, dtype=torch.int32))
        o = same_budget_oracle(q, k, v, plan, cfg.block_size, rows=1024)
        dens = reference.density(masks)
        per = ""
        if kind == "mixture":
            for cls, hs in (("early", [0, 1]), ("late", list(range(2, 8)))):
                oc = same_budget_oracle(q[:, hs], k[:, hs], v[:, hs], types.SimpleNamespace(idx=idx[:, hs], counts=counts[:, hs], dense=plan.dense), cfg.block_size, rows=1024)
                per += f" | {cls}: dens {float(dens[hs].mean()):.3f} err {oc['plan_rel_err']:.3f} oracle {oc['oracle_rel_err']:.3f}"
        print(f"n={n} {kind:<9} density {float(dens.mean()):.4f} routes {sel.route.tolist()} plan err {o['plan_rel_err']:.4f} "
              f"mass {o['plan_mass']:.4f} | oracle err {o['oracle_rel_err']:.4f} mass {o['oracle_mass']:.4f}{per} ({time.time()-t:.0f}s)", flush=True)
