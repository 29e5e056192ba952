"""CRISP's reference pipeline on the layer-class mixture vs the shipped mean spec (CPU): density, error
and kept mass over the last 1024 rows, beside the same-budget oracle. 8 kv heads, one query head each
(Llama-like d=128, 2 early + 6 late kv heads by kv_assignment). NS=32768,131072 CLASSES=path."""
import os, time, types, torch
from crisp_trt import CrispConfig, reference
from crisp_trt.bench.recall import same_budget_oracle
from crisp_trt.kernels.pipeline import lists_from_masks
from crisp_trt.workloads.fit import fitted_spec
from crisp_trt.workloads.mixture import fitted_classes, kv_assignment, workload_qkv
torch.set_num_threads(2)
D = int(os.environ.get("D", 128))
classes = fitted_classes(os.environ.get("CLASSES", "crisp_trt/workloads/fitted_smollm2_classes.json"))
for n in [int(x) for x in os.environ.get("NS", "32768").split(",")]:
    for kind, spec in (("classes", classes), ("mean", fitted_spec())):
        if kind not in os.environ.get("KINDS", "classes,mean"):
            continue
        t = time.time()
        q, k, v = (x[0].float() for x in workload_qkv(spec, n, 8, 8, D, seed=10, dtype=torch.bfloat16))
        cfg = CrispConfig()
        sel, masks = reference.select_masks(q, k, cfg)
        nb = masks.shape[-1]
        idx, counts = lists_from_masks([masks], nb, nb)
        plan = types.SimpleNamespace(idx=idx, counts=counts, dense=torch.zeros(1, dtype=torch.int32))
        o = same_budget_oracle(q, k, v, plan, cfg.block_size, rows=1024)
        dens = reference.density(masks)
        per = ""
        if kind == "classes":
            assign = kv_assignment(classes, 8)
            for ci, c in enumerate(classes):
                hs = [h for h, a in enumerate(assign) if a == ci]
                sub = types.SimpleNamespace(idx=idx[:, hs], counts=counts[:, hs], dense=plan.dense)
                oc = same_budget_oracle(q[:, hs], k[:, hs], v[:, hs], sub, cfg.block_size, rows=1024)
                per += f" | {c.name}: dens {float(dens[hs].mean()):.3f} err {oc['plan_rel_err']:.3f} oracle {oc['oracle_rel_err']:.3f}"
        print(f"n={n} {kind:<8} density {float(dens.mean()):.4f} routes {sel.route.tolist()} plan err {o['plan_rel_err']:.4f} "
              f"mass {o['plan_mass']:.4f} | oracle err {o['oracle_rel_err']:.4f} mass {o['oracle_mass']:.4f}{per} ({time.time()-t:.0f}s)", flush=True)
