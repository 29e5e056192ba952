"""Why attend runs below cuDNN's rate on a real model's lists: the op's stages and attend variants on real Q/K/V.

    python3 scripts/probes/attend_real.py [--model /tmp/qwen_hf] [--n 32k] [--layers 0,4,8,12,16,20,23]
        [--config '{"rows": 16, ...}'] [--source code_calib]
    python3 scripts/probes/attend_real.py --lists lists_32768.pt [--shape qwen]   # saved lists, random Q/K/V

Captures the chosen layers of the model on calibration text (workloads.real.capture, bf16 on the GPU), plans
each with the config (pipeline.Stages; default rows16_g0.98), and times in the same run: cuDNN, the plan
(st.plan()), attend on the real lists, and attend on transformed lists that keep one property of the real
ones and change another:
  real        the planned lists
  contiguous  each row's count kept, its blocks the latest ones (qb − 1, qb − 2, ...): scattered reads cost
  uniform     the layer's total blocks, every (head, row) the same share of its causal blocks (latest blocks, as
              contiguous): what the spread of counts over heads and rows costs
  diagonal    no listed block (the diagonal alone): the per-(row, head) overhead
and the real lists in other program orders (an order table in place of the unused LSE pointer) or kernels:
  heads_outer  a head's query blocks latest first, one head after another (attend's grid before session 27; the
               shipped grid has a row's heads together, latest rows first)
  lpt          (row, head) items by their counts, largest first
  host_tma     K / V descriptors built on the host and passed by value (shipped: each program writes two into
               the workspace and fences before its first copy); TMA only
  persistent   2 programs an SM walk the (row, head) items in LPT order, descriptors made once a program; TMA only
  diag_tma     the masked diagonal block's K / V through the descriptors too (shipped: pointer loads, which the
               loop's pipeline does not prefetch); TMA only
  idx16        the list read 16 entries at a time into registers (the shipped loop loads block i + 1's index one
               block ahead and waits on it before issuing that block's K / V copies); TMA only
and the shipped kernel under other launch options (launch.options: 4 warps, 3 stages at d 64):
  warps8       8 warps (two warpgroups of 64 rows each)
  stages2      2 stages; stages4: 4 stages (the K / V ring's depth)
Rate = blocks computed per ms over cuDNN's causal blocks per ms. Prints per-layer lines, then a summed table;
writes $OUT/attend_real.json and, from a model run, the lists as packed bit masks, $OUT/lists_<n>.pt ({"n",
"config", "source", "lists": {layer: uint8 [H, NB, ceil(NB / 8)]}}; `unpack` reads them back). Attend's speed does
not depend on the values, so `--lists` times such a file on random Q/K/V, without the model; `--cpu` writes one
from a CPU capture planned by the reference.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch
import triton

from crisp_trt import CrispConfig
from crisp_trt.bench.op import dense_fn, median_ms
from crisp_trt.kernels.pipeline import Stages, lists_from_masks, masks_from_plan
from crisp_trt.lengths import parse_length
from variants import variant_module

ORDERED = [("    h = tl.program_id(0)  # a query block's heads together: GQA groups share K / V reads in L2\n"
            "    qb = NQB - 1 - tl.program_id(1)  # the longest key lists first, over every head: a shorter tail on "
            "the last wave\n",
            "    item = tl.load(lse_ptr + tl.program_id(1) * H + tl.program_id(0))"
            ".to(tl.int32, bitcast=True)\n"
            "    qb = item % NQB\n"
            "    h = item // NQB\n")]  # the launch's linear order (x fastest) reads an order table of items
HOST_TMA = [("def attend_kernel(q_ptr, k_ptr, v_ptr, o_ptr,", "def attend_kernel(q_ptr, k_ptr, v_ptr, k_desc, v_desc, o_ptr,"),
            ("""        k_src = tl.make_tensor_descriptor(k_ptr, shape=[total_k, HK * D], strides=[HK * D, 1], block_shape=[BLOCK, D])
        v_src = tl.make_tensor_descriptor(v_ptr, shape=[total_k, HK * D], strides=[HK * D, 1], block_shape=[BLOCK, D])
""", """        k_src = k_desc
        v_src = v_desc
""")]  # TMA only: descriptors built once on the host (a __grid_constant__ argument), none written per program
_SOURCE = (Path(__file__).resolve().parents[2] / "crisp_trt/kernels/attend.py").read_text()
_BODY = _SOURCE[_SOURCE.index("    h = tl.program_id(0)"):_SOURCE.index("def attend(")].rstrip() + "\n"
_ITEM = _BODY.split("        return\n", 1)[1]  # one row's work, after the early exit (the probe's items are all in range)
_DESCRIPTORS = _ITEM[_ITEM.index("    if TMA:\n        k_src"):_ITEM.index("    if INTERPRET:")]
_LOOP = _ITEM[_ITEM.index("    if INTERPRET:"):_ITEM.index("    k_pos = qb * BLOCK + rows")]
_PIPELINED = _LOOP[_LOOP.index("        for i in tl.range"):]


def _persistent_body() -> str:
    """The shipped kernel's per-row work (_ITEM), less its descriptors and interpreter loop, inside a loop over an
    order table's items; the descriptors made once before it."""
    item = _ITEM.replace(_DESCRIPTORS, "").replace(_LOOP, _PIPELINED[4:].replace("\n        ", "\n    "))
    return ("    s = 0  # one sequence (the probe's launch)\n"
            "    q_start, q_len, start, n = chunk_bounds(cu_ptr, cu_k_ptr, s, total, total_k, NQB * BLOCK)\n"
            "    first = n - q_len\n"
            "    HK = H // G\n"
            + _DESCRIPTORS.replace("    if TMA:\n", "").split("    else:")[0].replace("\n        ", "\n    ")[4:]
            + "    for it in range(tl.program_id(0), NQB * H, tl.num_programs(0)):\n"
            "        item = tl.load(lse_ptr + it).to(tl.int32, bitcast=True)\n"
            "        qb = item % NQB\n"
            "        h = item // NQB\n"
            + "".join("    " + line if line.strip() else line for line in item.splitlines(keepends=True)))


PERSISTENT = [(_BODY, _persistent_body())]  # TMA only: min(items, 2 per SM) programs walk an order table's items
INDEX_CHUNKS = [("""        for i in tl.range(0, count):
            acc, m_i, l_i = _listed_block(acc, m_i, l_i, q, i, idx_ptr, row, listed, dense, start, qb, k_src, v_src,
                                          hk, qk_scale, HK, MAXK, BLOCK, D, TMA)
""", """        for c0 in range(0, count, 16):  # 16 list entries into registers: a block's TMA issue waits on no load
            j = c0 + tl.arange(0, 16)
            kbs = tl.load(idx_ptr + row.to(tl.int64) * MAXK + j * listed, mask=j < count, other=0) * listed + j * dense
            kbs = tl.maximum(tl.minimum(kbs, qb - 1), 0)
            for jj in tl.range(0, tl.minimum(16, count - c0)):
                kb = tl.sum(tl.where(tl.arange(0, 16) == jj, kbs, 0))
                acc, m_i, l_i = _attend_block(acc, m_i, l_i, q, k_src, v_src, start + kb * BLOCK, hk * D, None, None,
                                              qk_scale, False, True)
""")]  # TMA only (the Qwen shape on sm_90)
DIAG_TMA = [("""    if MASKED:
        k = tl.load(k_src, mask=key_ok[:, None], other=0.0)
        s = tl.where(causal_ok, tl.dot(q, tl.trans(k)) * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        v = tl.load(v_src, mask=key_ok[:, None], other=0.0)
""", """    if MASKED:  # descriptors: rows past total_k read as 0, keys past the sequence are masked by causal_ok
        k = k_src.load([at_row, at_col])
        s = tl.where(causal_ok, tl.dot(q, tl.trans(k)) * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        v = v_src.load([at_row, at_col])
"""), ("""    acc, m_i, l_i = _attend_block(acc, m_i, l_i, q, k_ptr + kv_off[:, None] + cols[None, :],
                                  v_ptr + kv_off[:, None] + cols[None, :], 0, 0, k_pos < n, causal, qk_scale, True,
                                  False)
""", """    acc, m_i, l_i = _attend_block(acc, m_i, l_i, q, k_src, v_src, start + qb * BLOCK, hk * D, k_pos < n, causal,
                                  qk_scale, True, True)
""")]  # TMA only: the diagonal's K / V through the descriptors too (the shipped kernel loads them by pointers)
OPTIONS = {"warps8": {"num_warps": 8}, "stages2": {"num_stages": 2}, "stages4": {"num_stages": 4}}
TIMED = ("real", "contiguous", "uniform", "diagonal", "heads_outer", "lpt", "idx16", "host_tma", "persistent",
         "diag_tma",
         *OPTIONS)
LAUNCHES = 3  # back-to-back launches per timed call: Triton's launcher costs host time the shipped launch does not


def transformed(idx, counts, how: str):
    """(idx, counts) [1, H, NB, MAXK] / [1, H, NB] with one property of the real lists changed (see the doc)."""
    _, heads, nb, maxk = idx.shape
    qb = torch.arange(nb, device=idx.device)
    if how == "diagonal":
        return idx, torch.zeros_like(counts)
    if how == "uniform":
        counts = uniform_counts(counts, maxk)
    t = torch.arange(maxk, device=idx.device)
    latest = (qb[:, None] - 1 - t[None, :]).clamp_min(0).int()  # qb − 1, qb − 2, ...
    return latest.expand(1, heads, nb, maxk).contiguous(), counts


def uniform_counts(counts, maxk: int):
    """counts [1, H, NB] → the same total spread so that every (head, row) gets the same share of its causal
    blocks (at most maxk)."""
    _, heads, nb = counts.shape
    qb = torch.arange(nb, device=counts.device)
    share = float(counts.sum()) / float(heads * qb.sum().clamp_min(1))
    return torch.minimum((share * qb).round().int(), torch.tensor(maxk)).expand(1, heads, nb).contiguous()


def pack(mask):
    """A block mask bool [H, NB, NB] (its lists: the blocks below the diagonal) → uint8 [H, NB, ceil(NB / 8)] on
    the CPU."""
    heads, nb, _ = mask.shape
    width = -(-nb // 8) * 8
    bits = torch.nn.functional.pad(mask, (0, width - nb)).reshape(heads, nb, -1, 8).to(torch.uint8)
    return (bits << torch.arange(8, dtype=torch.uint8, device=mask.device)).sum(-1).to(torch.uint8).cpu()


def unpack(bits, nb: int):
    """pack's inverse: the block mask bool [H, NB, NB]."""
    return ((bits[..., None] >> torch.arange(8, dtype=torch.uint8)) & 1).bool().reshape(bits.shape[0], nb, -1)[..., :nb]


def orders(counts, how: str):
    """int32 [H · NB] items h · NB + qb in launch order, viewed as f32 (the ordered variant's table): heads_outer,
    heads_inner (the shipped grid's order) or lpt."""
    _, heads, nb = counts.shape
    qb = torch.arange(nb, device=counts.device)
    h = torch.arange(heads, device=counts.device)
    if how == "heads_outer":
        item = (h[:, None] * nb + qb.flip(0)[None, :]).reshape(-1)
    elif how == "heads_inner":
        item = (h[None, :] * nb + qb.flip(0)[:, None]).reshape(-1)
    else:  # lpt
        flat = counts[0].reshape(-1).to(torch.int64)
        item = torch.argsort(-flat, stable=True)
    return item.int().contiguous().view(torch.float32)


def captured(args, device: str, dtype) -> dict:
    """{layer: (q, k, v)} of --layers: the model (--model, else the bundled Qwen GGUF) on --n tokens of --source."""
    from crisp_trt.bench.accuracy import use_rope
    from crisp_trt.models import load_model, qwen_path, rope_for
    from crisp_trt.workloads.real import capture, text_ids

    model, tok = load_model(args.model if Path(args.model).exists() else qwen_path(), attn_implementation="sdpa",
                            dtype=dtype, device=device)
    use_rope(model, rope_for(model), args.n)
    return capture(model, text_ids(tok, args.n, source=args.source), layers_of(args), out_device=device, dtype=dtype)


def layers_of(args) -> list[int]:
    return [int(x) for x in args.layers.split(",")]


def planned(args, cfg: CrispConfig):
    """(layer, q, k, v, stats) per layer: the model's captured Q/K/V planned with cfg (stats: the plan's lists,
    dense flag, density and its stages' ms), or with --lists random Q/K/V of the model's shape beside the saved
    lists (no plan times: those depend on the values)."""
    from crisp_trt.bench.op import SHAPES

    if args.lists:
        saved = torch.load(args.lists)
        n, heads, kv, d = saved["n"], *SHAPES[args.shape]
        nb = -(-n // cfg.block_size)  # cfg: the file's (main)
        for layer in [x for x in layers_of(args) if x in saved["lists"]]:
            if saved["lists"][layer].shape[0] != heads:
                raise SystemExit(f"--lists: layer {layer} has {saved['lists'][layer].shape[0]} heads; --shape "
                                 f"{args.shape} has {heads}")
            q, k, v = (torch.randn(n, h, d, device="cuda", dtype=torch.bfloat16) for h in (heads, kv, kv))
            idx, counts = (t.cuda() for t in lists_from_masks([unpack(saved["lists"][layer], nb)], nb, nb))
            density = float(counts.sum() + heads * nb) / (heads * nb * (nb + 1) / 2)
            yield layer, q, k, v, dict(idx=idx, counts=counts, dense=torch.zeros(1, dtype=torch.int32, device="cuda"),
                                       density=density)
        return
    grabbed = captured(args, "cuda", torch.bfloat16)
    for layer in layers_of(args):
        q, k, v = (t[0] for t in grabbed.pop(layer))
        cu = torch.tensor([0, args.n], dtype=torch.int32, device="cuda")
        st = Stages(q, k, cu, args.n, cfg)
        stats = dict(plan_ms=median_ms(st.plan, args.repeats, "cuda"))
        plan = st.plan()
        stats["scores_ms"] = median_ms(st.scores, args.repeats, "cuda")  # rows (and spike), over the same route
        stats["lists_ms"] = median_ms(st.lists, args.repeats, "cuda")
        stats.update(idx=plan.idx.clone(), counts=plan.counts.clone(), dense=plan.dense.clone(),
                     density=float(plan.density.mean()))
        yield layer, q, k, v, stats


def cpu_lists(args, cfg: CrispConfig) -> Path:
    """--cpu: capture on the CPU (fp32 model, the bundled GGUF or --model) and plan with the reference, then save
    lists_<n>.pt for a later --lists run on the GPU (no staging there). Slow: a 32k forward takes many minutes."""
    from crisp_trt.bench.op import reference_masks

    grabbed = captured(args, "cpu", torch.float32)
    saved = {}
    for layer in layers_of(args):
        q, k, _ = (t[0] for t in grabbed.pop(layer))
        mask = reference_masks(q, k, cfg)
        saved[layer] = pack(mask)
        print(f"L{layer}: density {float(mask.sum()) / (mask.shape[0] * mask.shape[1] * (mask.shape[1] + 1) / 2):.3f}",
              flush=True)
    out = Path(os.environ.get("OUT", "/tmp")) / f"lists_{args.n}.pt"
    torch.save({"n": args.n, "config": cfg.to_dict(), "source": args.source, "lists": saved, "planner": "reference"},
               out)
    return out


def main() -> None:
    from crisp_trt.kernels import attend as shipped
    from crisp_trt.kernels.launch import arch_of, options, tma
    from crisp_trt.kernels.launch import grid as launch_grid
    from triton.tools.tensor_descriptor import TensorDescriptor

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="/tmp/qwen_hf")
    ap.add_argument("--n", type=parse_length, default=32768)
    ap.add_argument("--layers", default="0,4,8,12,16,20,23")
    ap.add_argument("--source", default="code_calib", help="a texts corpus (calibration text: not evaluation)")
    ap.add_argument("--config", default=json.dumps(CrispConfig.sampled_rows(gamma=0.98).to_dict()),
                    help="CrispConfig fields over the default (JSON)")
    ap.add_argument("--lists", default=None, help="a lists_<n>.pt this probe saved: time its lists on random Q/K/V "
                    "(no model, no plan times)")
    ap.add_argument("--shape", default="qwen", help="with --lists: the model's heads (bench.op.SHAPES)")
    ap.add_argument("--cpu", action="store_true", help="only capture and plan on the CPU (reference), save the lists")
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    cfg = CrispConfig.from_dict({**CrispConfig().to_dict(), **json.loads(args.config)})
    if args.lists:
        cfg = CrispConfig.from_dict(torch.load(args.lists)["config"])  # the lists' own config (block size)
    if args.cpu:
        print(f"saved {cpu_lists(args, cfg)}")
        return
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))  # TMA
    tmp = Path(tempfile.mkdtemp())
    ordered = variant_module("attend", "ordered", ORDERED, tmp)
    chunked = variant_module("attend", "idx16", INDEX_CHUNKS, tmp)
    host = variant_module("attend", "host_tma", HOST_TMA, tmp)
    persistent = variant_module("attend", "persistent", PERSISTENT, tmp)
    diag = variant_module("attend", "diag_tma", DIAG_TMA, tmp)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    block = cfg.block_size
    rows, saved = [], {}
    for layer, q, k, v, stats in planned(args, cfg):
        n, (heads, d) = q.shape[0], q.shape[1:]
        nb = -(-n // block)
        causal = nb * (nb + 1) / 2
        cu = torch.tensor([0, n], dtype=torch.int32, device="cuda")
        cudnn = dense_fn("dense_cudnn", q, k, v)
        cudnn_ms = median_ms(cudnn, args.repeats, "cuda")
        idx, counts, dense = stats.pop("idx"), stats.pop("counts"), stats.pop("dense")
        if int(dense.sum()):
            print(f"L{layer}: the plan is dense (short or dense_below): no lists to time", flush=True)
            continue
        saved[layer] = pack(masks_from_plan(SimpleNamespace(idx=idx, counts=counts, dense=dense), 0, nb))
        use_tma = tma(block, d, arch_of(q))
        opts = options("attend", block, d)
        lse = torch.empty(0, dtype=torch.float32, device="cuda")
        ref = shipped.attend(q, k, v, cu, idx, counts, dense, block).float()
        row = dict(layer=layer, n=n, cudnn_ms=cudnn_ms, **stats, gpu=torch.cuda.get_device_name())

        def time_attend(mod, i, c, table, **changes):
            out = torch.empty_like(q)
            descs = (() if mod is not host else
                     tuple(TensorDescriptor.from_tensor(t.view(n, -1), block_shape=[block, d]) for t in (k, v)))

            grid = (min(2 * sms, nb * heads), 1, 1) if mod is persistent else launch_grid("attend", nb=nb, H=heads, S=1)

            def launch():
                for _ in range(LAUNCHES):
                    mod.attend_kernel[grid](q, k, v, *descs, out, table, cu, cu, i, c, dense,
                                                      1 / math.sqrt(d), n, n, 0, heads, heads // k.shape[1], nb,
                                                      i.shape[-1], BLOCK=block, D=d, INTERPRET=False, TMA=use_tma,
                                                      **{**opts, **changes})
            ms = median_ms(launch, args.repeats, "cuda") / LAUNCHES
            blocks = float(c.sum()) / heads + nb
            return ms, (blocks / ms) / (causal / cudnn_ms), out

        for name in ("real", "contiguous", "uniform", "diagonal"):
            i, c = (idx, counts) if name == "real" else transformed(idx, counts, name)
            ms, rate, out = time_attend(shipped, i, c, lse)
            row[f"{name}_ms"], row[f"{name}_rate"] = ms, rate
            if name == "real":
                row["real_max_diff"] = float((out.float() - ref).abs().max())  # the shipped launch vs the op
        for name, mod, table, changes in (("heads_outer", ordered, orders(counts, "heads_outer"), {}),
                                          ("lpt", ordered, orders(counts, "lpt"), {}), ("idx16", chunked, lse, {}),
                                          ("host_tma", host, lse, {}),
                                          ("persistent", persistent, orders(counts, "lpt"), {}),
                                          ("diag_tma", diag, lse, {}),
                                          *((name, shipped, lse, changes) for name, changes in OPTIONS.items())):
            if name in ("idx16", "host_tma", "persistent", "diag_tma") and not use_tma:
                continue
            try:
                ms, rate, out = time_attend(mod, idx, counts, table, **changes)
            except Exception as e:  # a variant that does not compile here is reported, not fatal
                print(f"L{layer} {name}: FAILED {str(e)[:200]}", flush=True)
                continue
            row[f"{name}_ms"], row[f"{name}_rate"] = ms, rate
            row[f"{name}_max_diff"] = float((out.float() - ref).abs().max())
        if "plan_ms" in row:
            row["op_vs_cudnn"] = cudnn_ms / (row["plan_ms"] + row["real_ms"])
        rows.append(row)
        frac = {key: row[key] / cudnn_ms for key in row if key.endswith("_ms")}
        plan = (f"plan {frac['plan_ms']:.3f} (scores {frac['scores_ms']:.3f}, lists {frac['lists_ms']:.3f})  "
                if "plan_ms" in row else "")
        print(f"L{layer:<3} density {row['density']:.3f}  cuDNN {cudnn_ms:.3f} ms  {plan}rate: "
              + "  ".join(f"{m} {row[f'{m}_rate']:.2f}" for m in TIMED if f"{m}_rate" in row and m != "diagonal")
              + f"  diagonal alone {frac['diagonal_ms']:.3f} of dense  |diff| "
              + " ".join(f"{key[:-9]} {row[key]:.1g}" for key in row if key.endswith("_max_diff")), flush=True)
    if not rows:
        raise SystemExit(f"no layer to time: --layers {args.layers} (in --lists {args.lists}?)")
    out_dir = Path(os.environ.get("OUT", "/tmp"))
    if not args.lists:
        torch.save({"n": n, "config": cfg.to_dict(), "source": args.source, "lists": saved},
                   out_dir / f"lists_{n}.pt")
    (out_dir / "attend_real.json").write_text(json.dumps({"config": cfg.to_dict(), "source": args.source,
                                                          "rows": rows}, indent=1))
    tot = {key: sum(r[key] for r in rows) for key in rows[0] if key.endswith("_ms") and all(key in r for r in rows)}
    cols = [c for c in ("plan", "scores", "lists", *TIMED) if f"{c}_ms" in tot]
    print(f"\nsummed over layers {[r['layer'] for r in rows]} at n={n}: fraction of cuDNN's time"
          + (", and the op's speed-up (plan + attend)" if "plan_ms" in tot else " (random Q/K/V, saved lists)"))
    print("".join(f"{c[:10]:>11}" for c in cols) + (f"{'op x':>8}" if "plan_ms" in tot else ""))
    print("".join(f"{tot[f'{c}_ms'] / tot['cudnn_ms']:>11.3f}" for c in cols)
          + (f"{tot['cudnn_ms'] / (tot['plan_ms'] + tot['real_ms']):>8.2f}" if "plan_ms" in tot else ""))


if __name__ == "__main__":
    main()
