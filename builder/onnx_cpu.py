"""Run an exported CRISP prefill graph on the CPU with onnxruntime, the custom node bound to our op.

Why onnxruntime: every standard node then runs in an ONNX implementation that is not ours, so a
mistake in the exported graph (RoPE, norms, packing, the last-token gather) shows up as a difference to
transformers' forward instead of being mirrored by our own evaluator. The one node ONNX cannot know,
`crisp::CrispPrefillAttention`, is bound through onnxruntime-extensions' Python custom ops (PyOp) to
`crisp_prefill_attention` (the CPU reference) with the CrispConfig read back from the node's attributes:
what the TensorRT plugin computes from the same fields. PyOps live in the extensions' own domain, so the
copy of the graph handed to onnxruntime has that domain on the CRISP nodes; nothing else changes.
Needs `pip install onnxruntime onnxruntime-extensions` (the `test` extra). float32 graphs only (the CPU
kernels of onnxruntime are float32; the half graphs for TensorRT differ only in their dtypes).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from crisp_trt import plugin
from crisp_trt.api import crisp_prefill_attention
from crisp_trt.kernels import contract

from .checkpoint import BuildError

INSTALL_HINT = "pip install onnx onnxruntime onnxruntime-extensions (or pip install -e '.[test]')"
_REGISTERED: list = []
_IO_OPTIONS = tuple(plugin.options_of_attributes({}))  # chunked, return_lse: other inputs/outputs than the PyOp's


def _modules():
    try:
        import onnx
        import onnxruntime
        import onnxruntime_extensions
    except ImportError as exc:
        raise BuildError(f"running the ONNX graph on the CPU needs onnx, onnxruntime and onnxruntime-extensions "
                         f"({exc}): {INSTALL_HINT}")
    return onnx, onnxruntime, onnxruntime_extensions


def crisp_node(q: np.ndarray, k: np.ndarray, v: np.ndarray, cu_seqlens: np.ndarray, **attrs) -> np.ndarray:
    """The CrispPrefillAttention node on the CPU: packed q [T, H, d], k/v [T, H_kv, d], cu_seqlens [B + 1]."""
    config, heads, kv_heads, head_dim = plugin.config_of_attributes(attrs)
    if q.shape[1:] != (heads, head_dim) or k.shape[1:] != (kv_heads, head_dim):
        raise ValueError(f"{plugin.NAME}: q {q.shape} / k {k.shape} do not match the node's num_heads={heads}, "
                         f"num_kv_heads={kv_heads}, head_dim={head_dim}")
    out = crisp_prefill_attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), config=config,
                                  cu_seqlens=torch.from_numpy(cu_seqlens.astype(np.int32)))
    return out.numpy()


def _register(ortx) -> str:
    """Register crisp_node as a PyOp once per process (every plugin field but the optional input/output sets
    declared as an attribute); returns the PyOp domain."""
    if not _REGISTERED:
        d = ortx.PyCustomOpDef
        kinds = {"INT32": d.dt_int64, "FLOAT32": d.dt_float, "CHAR": d.dt_string}
        attrs = {name: kinds[kind] for name, kind in contract.FIELDS if name not in _IO_OPTIONS}
        attrs.update(plugin_namespace=d.dt_string, plugin_version=d.dt_string)
        ortx.onnx_op(op_type=plugin.NAME, inputs=[d.dt_float] * 3 + [d.dt_int32], outputs=[d.dt_float],
                     attrs=attrs)(crisp_node)
        _REGISTERED.append(ortx.default_opset_domain())
    return _REGISTERED[0]


def session(path: str | Path, threads: int | None = None):
    """An onnxruntime session of the graph at `path` (its .data file beside it), CRISP bound to crisp_node.

    Graph optimisations are off: the session evaluates the nodes as exported (no fusions)."""
    onnx, ort, ortx = _modules()
    path = Path(path)
    domain = _register(ortx)
    proto = onnx.load(str(path), load_external_data=False)
    if proto.graph.node and not any(n.op_type == plugin.NAME for n in proto.graph.node):
        raise BuildError(f"{path}: no {plugin.NAME} node in the graph")
    for node in proto.graph.node:
        if node.op_type == plugin.NAME:
            given = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            unbound = sorted(n for n in _IO_OPTIONS if given.get(n, 0))
            if unbound:
                raise BuildError(f"{path}: node {node.name!r} sets {', '.join(f'{n}={given[n]}' for n in unbound)}: "
                                 f"the CPU session runs one packed q/k/v/cu_seqlens → out node; expected them absent")
            # onnxruntime-extensions needs every declared attribute present: an absent optional field is its default
            node.attribute.extend(onnx.helper.make_attribute(n, v) for n, v in contract.OPTIONAL.items()
                                  if n not in given and n not in _IO_OPTIONS)
        if node.domain == plugin.ONNX_DOMAIN:
            node.domain = domain
    for opset in proto.opset_import:
        if opset.domain == plugin.ONNX_DOMAIN:
            opset.domain = domain
    copy = path.with_name(path.stem + ".cpu.onnx")  # beside the original, so the external data resolves
    onnx.save_model(proto, str(copy))
    options = ort.SessionOptions()
    options.register_custom_ops_library(ortx.get_library_path())
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if threads:
        options.intra_op_num_threads = threads
    try:
        return ort.InferenceSession(str(copy), options, providers=["CPUExecutionProvider"])
    finally:
        copy.unlink()


def run(sess, input_ids, cu_seqlens) -> dict[str, np.ndarray]:
    """Outputs by name for one packed batch (input_ids [tokens], cu_seqlens [batch + 1], any int type)."""
    feed = {"input_ids": np.asarray(input_ids, dtype=np.int32).reshape(-1),
            "cu_seqlens": np.asarray(cu_seqlens, dtype=np.int32).reshape(-1)}
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feed)))
