"""Plugin-in-network check (issue 22 item 1): CrispPrefillAttention inside a real TensorRT builder's network.

    python3 scripts/device/gpu_trt_rtx.py --json OUT.json [--max-tokens 131072] [--max-batch 4]

Loads libcrisp_trt_plugin.so into the builder's registry (crisp_trt.plugin.load), adds the plugin to a network
with packed varlen inputs q/k/v [-1, H, d] + cu_seqlens [-1] (add_plugin_v3 where the Python bindings have it;
TensorRT-RTX 1.7's have none, so there a one-node ONNX graph goes through the ONNX parser, whose C++ side calls
addPluginV3), builds and serialises a plan with one profile up to --max-tokens, and compares what the builder
asked with the plugin's own answers: output shape (getOutputShapes through IExprBuilder: [q.d0, H, d]), output
type (= q's), workspace (a build with the workspace pool one byte under the plugin's getWorkspaceSize — the
torch op's launch.Workspace for the profile maximum — must fail, one at it must pass). Each case runs in a
child process, so a library abort (seen on the CPU with RTX 1.7.1's parser) is reported, not fatal.
Prints one JSON line per case; --json writes them all.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

CASES = [(32, 8, 128, "float16"), (14, 2, 64, "bfloat16"), (9, 3, 64, "float16")]


def _one_node_onnx(heads, kv, d, dtype, attrs):
    from onnx import TensorProto, helper

    from crisp_trt import plugin

    t = {"float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}[dtype]
    node = helper.make_node(plugin.NAME, ["q", "k", "v", "cu_seqlens"], ["out"], domain=plugin.ONNX_DOMAIN, **attrs)
    ins = [helper.make_tensor_value_info("q", t, ["tokens", heads, d]),
           helper.make_tensor_value_info("k", t, ["tokens", kv, d]),
           helper.make_tensor_value_info("v", t, ["tokens", kv, d]),
           helper.make_tensor_value_info("cu_seqlens", TensorProto.INT32, ["batch_plus_1"])]
    graph = helper.make_graph([node], "crisp_one", ins, [helper.make_tensor_value_info("out", t, ["tokens", heads, d])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(plugin.ONNX_DOMAIN, 1)])
    model.ir_version = 8
    return model.SerializeToString()


def case(heads: int, kv: int, d: int, dtype: str, max_tokens: int, max_batch: int) -> dict:
    """One case in this process: one network, checks, then two more builds of it around the plugin's workspace."""
    from crisp_trt import plugin
    from crisp_trt.builder import engine
    from crisp_trt.config import CrispConfig
    from crisp_trt.kernels import launch

    trt = plugin.tensorrt(builder=True)
    logger = engine.make_logger(trt)
    builder = trt.Builder(logger)
    creator = plugin.load(trt=trt)
    cfg = CrispConfig()
    rec = {"case": f"{heads}/{kv} d{d} {dtype}", "builder": trt.__name__, "version": getattr(trt, "__version__", "?")}

    def network():
        net = builder.create_network(engine.network_flags(trt))
        if hasattr(net, "add_plugin_v3"):
            pl = creator.create_plugin("crisp", plugin.field_collection(cfg, heads, kv, d, trt=trt), trt.TensorRTPhase.BUILD)
            tt = getattr(trt, dtype)
            q = net.add_input("q", tt, (-1, heads, d))
            k, v = (net.add_input(n, tt, (-1, kv, d)) for n in ("k", "v"))
            cu = net.add_input("cu_seqlens", trt.int32, (-1,))
            layer = net.add_plugin_v3([q, k, v, cu], [], pl)
            layer.get_output(0).name = "out"
            net.mark_output(layer.get_output(0))
            return net, None, "add_plugin_v3"
        parser = trt.OnnxParser(net, logger)
        if not parser.parse(_one_node_onnx(heads, kv, d, dtype, plugin.onnx_attributes(cfg, heads, kv, d))):
            raise RuntimeError("parser: " + "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors)))
        return net, parser, "onnx parser (these Python bindings have no add_plugin_v3)"

    net, _parser, route = network()  # once per case (the parser holds the weights: kept); builds vary the config

    def build(pool: int | None):
        """The network's serialised plan (None when the builder refuses) with the workspace pool at `pool` bytes."""
        profile = builder.create_optimization_profile()
        for name, width in (("q", heads), ("k", kv), ("v", kv)):
            profile.set_shape(name, (1, width, d), (8192, width, d), (max_tokens, width, d))
        profile.set_shape("cu_seqlens", (2,), (2,), (max_batch + 1,))
        config = builder.create_builder_config()
        config.add_optimization_profile(profile)
        if pool is not None:
            config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, pool)
        return builder.build_serialized_network(net, config)

    plan = build(None)
    layers = engine.plugin_layers(trt, net)
    out = net.get_output(0)
    rec.update(route=route, plugin_layers=len(layers), layer_type=str(layers[0].type) if layers else None,
               out_shape=list(out.shape), out_dtype=str(out.dtype), plan_bytes=plan.nbytes if plan is not None else 0)
    rec["shape_ok"] = list(out.shape) == [-1, heads, d]
    rec["dtype_ok"] = out.dtype == getattr(trt, dtype)
    ws = launch.workspace(max_batch, heads, kv, d, cfg, max_tokens)[1].size
    rec["plugin_workspace"] = ws
    if plan is not None:
        rec["build_at_workspace"] = build(ws) is not None
        rec["build_below_workspace"] = build(ws - 1) is not None
    try:
        runtime = trt.Runtime(logger)
        eng = runtime.deserialize_cuda_engine(plan) if plan is not None else None
        rec["runtime"] = "deserialised" if eng is not None else "refused: " + (logger.errors()[-300:] or "no message")
    except Exception as exc:  # RTX on an unsupported GPU
        rec["runtime"] = f"refused: {type(exc).__name__}: {exc}"[:300]
    rec["errors"] = logger.errors()[-500:]
    rec["ok"] = bool(plan is not None and rec["shape_ok"] and rec["dtype_ok"] and len(layers) == 1
                     and rec.get("build_at_workspace"))
    return rec


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    p.add_argument("--max-tokens", type=int, default=131072)
    p.add_argument("--max-batch", type=int, default=4)
    p.add_argument("--case", default=None, help="H,KV,D,DTYPE: run one case here (the child process)")
    a = p.parse_args(argv)
    if a.case:
        h, kv, d, dt = a.case.split(",")
        print(json.dumps(case(int(h), int(kv), int(d), dt, a.max_tokens, a.max_batch)))
        return 0
    rows = []
    for h, kv, d, dt in CASES:
        proc = subprocess.run([sys.executable, __file__, "--case", f"{h},{kv},{d},{dt}", "--max-tokens",
                               str(a.max_tokens), "--max-batch", str(a.max_batch)], capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        row = json.loads(lines[-1]) if lines else {
            "case": f"{h}/{kv} d{d} {dt}", "ok": False,
            "failure": f"child exited {proc.returncode}: " + (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows}, f, indent=2)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
