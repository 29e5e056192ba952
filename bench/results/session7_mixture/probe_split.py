"""Where does CRISP's error on the layer-class workload come from? On the GPU, per class (early = kv heads
0-1, late = 2-7 for the Llama shape), the op's output error against cuDNN dense and density, at 32k and
128k, with 4 query heads per kv head (the speed table's shape) and with 1 (session 6's CPU check)."""
import json, os, sys, torch
from crisp_trt import CrispConfig, crisp_prefill_attention
from crisp_trt.bench.op import dense_fn
from crisp_trt.workloads.mixture import fitted_classes, kv_assignment, mixture_qkv
classes, out = fitted_classes(), []
for n in (32768, 131072):
    for heads, kv in ((32, 8), (8, 8)):
        q, k, v = (t[0] for t in mixture_qkv(n, heads, kv, 128, classes=classes, dtype=torch.bfloat16, device="cuda"))
        ref = dense_fn("dense_cudnn", q, k, v)().float()
        o, st = crisp_prefill_attention(q, k, v, config=CrispConfig(), return_stats=True)
        group = heads // kv
        row = {"n": n, "heads": heads, "kv": kv, "err": float((o.float() - ref).norm() / ref.norm()),
               "density": st.mean_density}
        for ci, c in enumerate(classes):
            hs = [h for h in range(heads) if kv_assignment(classes, kv)[h // group] == ci]
            d = (o.float()[:, hs] - ref[:, hs]).norm() / ref[:, hs].norm()
            row[c.name] = {"err": float(d), "density": float(st.density.float().reshape(-1, heads)[:, hs].mean())}
            last = (o.float()[-1024:, hs] - ref[-1024:, hs]).norm() / ref[-1024:, hs].norm()
            row[c.name]["err_last_rows"] = float(last)
        print(json.dumps(row), flush=True)
        out.append(row)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "class_split.json"), "w"), indent=1)
