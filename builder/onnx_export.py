"""The prefill graph of a Llama-family HF model as ONNX, with CRISP in every attention layer.

Every attention layer becomes one `CrispPrefillAttention` node (domain `crisp`, version 1, the plugin's
fields as attributes: `crisp_trt.plugin.onnx_attributes`), which TensorRT's ONNX parser maps to the
plugin; the rest is standard ONNX (opset 17) that the parser imports natively. Packed varlen batch:

    inputs   input_ids  int32 [tokens]          sequences packed along the token axis
             cu_seqlens int32 [batch + 1]       offsets: 0, len0, len0 + len1, ..., tokens
    outputs  logits     float32 [batch, vocab]  each sequence's last-token logits
             present.{i}.key / .value  [tokens, num_kv_heads, head_dim]   layer i's post-RoPE K and V

RoPE positions restart at every sequence start; the frequencies (and YaRN's attention factor) are the
model's own `rotary_emb` buffers, so linear / yarn / llama3 scaling export as they run. The graph computes
in one dtype (the weights'), with RMSNorm and RoPE tables in float32 as transformers does. Weights go to
one external-data file next to the .onnx (no 2 GB protobuf limit).

Supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM (q/k/v biases) with SiLU MLPs and full
attention in every layer; anything else is refused with a BuildError naming what does not fit.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import torch

from crisp_trt import plugin
from crisp_trt.config import CrispConfig

from .checkpoint import SUPPORTED_ARCHITECTURES, BuildError, unsupported

OPSET = 17
INPUTS = ("input_ids", "cu_seqlens")
STATIC_ROPE = ("default", "linear", "yarn", "llama3")


def _onnx():
    try:
        import onnx
    except ImportError:
        raise BuildError("exporting the TensorRT prefill graph needs the onnx package: "
                         "pip install onnx (or pip install -e '.[tensorrt]')")
    return onnx


def output_names(num_layers: int) -> list[str]:
    """logits, then present.{i}.key / present.{i}.value for every layer."""
    return ["logits"] + [f"present.{i}.{kind}" for i in range(num_layers) for kind in ("key", "value")]


@dataclasses.dataclass
class ModelSpec:
    """What the graph needs of the HF model, checked (`describe`)."""

    architecture: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    eps: float
    inv_freq: torch.Tensor
    attention_scaling: float
    dtype: torch.dtype


def _need(obj, path: str, what: str):
    for part in path.split("."):
        if not hasattr(obj, part):
            raise BuildError(f"malformed model: {what} has no {path} (expected the Llama-family module layout: "
                             "model.embed_tokens, model.layers[i].self_attn.{q,k,v,o}_proj, .mlp.{gate,up,down}_proj, "
                             "input/post_attention_layernorm, model.norm, model.rotary_emb, lm_head)")
        obj = getattr(obj, part)
    return obj


def describe(model) -> ModelSpec:
    """Check that `model` is a supported Llama-family causal LM and read its shapes; BuildError otherwise."""
    cfg = model.config
    archs = list(getattr(cfg, "architectures", None) or [type(model).__name__])
    if archs[0] not in SUPPORTED_ARCHITECTURES:
        raise BuildError(unsupported(repr(archs[0])))
    layer_types = list(getattr(cfg, "layer_types", None) or [])
    other = sorted({t for t in layer_types if t != "full_attention"})
    if other or getattr(cfg, "use_sliding_window", False):
        which = [i for i, t in enumerate(layer_types) if t != "full_attention"]
        raise BuildError(f"unsupported model: layers {which or 'all'} use {other or ['sliding_window']} attention; "
                         "the ONNX export puts CRISP in full-attention layers and has no sliding-window layer yet")
    act = getattr(cfg, "hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise BuildError(f"unsupported model: hidden_act={act!r}, expected 'silu' (SwiGLU MLP)")
    inner = _need(model, "model", "the model")
    layers = _need(inner, "layers", "model.model")
    rotary = _need(inner, "rotary_emb", "model.model")
    rope_type = getattr(rotary, "rope_type", "default")
    if rope_type not in STATIC_ROPE:
        raise BuildError(f"unsupported model: rope_type={rope_type!r} changes its frequencies with the length; "
                         f"the exported graph needs static RoPE ({', '.join(STATIC_ROPE)})")
    heads = int(cfg.num_attention_heads)
    kv = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    if len(layers) != cfg.num_hidden_layers:
        raise BuildError(f"malformed model: {len(layers)} layers, config.num_hidden_layers={cfg.num_hidden_layers}")
    for i, layer in enumerate(layers):
        attn = _need(layer, "self_attn", f"layer {i}")
        for name, rows in (("q_proj", heads * head_dim), ("k_proj", kv * head_dim), ("v_proj", kv * head_dim)):
            weight = _need(attn, f"{name}.weight", f"layer {i} self_attn")
            if tuple(weight.shape) != (rows, cfg.hidden_size):
                raise BuildError(f"malformed model: layer {i} self_attn.{name}.weight has shape {tuple(weight.shape)}, "
                                 f"expected ({rows}, {cfg.hidden_size}) from the config's heads and head_dim")
        scale = getattr(attn, "scaling", head_dim ** -0.5)
        if abs(scale - head_dim ** -0.5) > 1e-6 * head_dim ** -0.5:
            raise BuildError(f"unsupported model: layer {i} scales attention by {scale}, the plugin by 1/sqrt(head_dim)")
        for path in ("o_proj.weight",):
            _need(attn, path, f"layer {i} self_attn")
        for path in ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                     "input_layernorm.weight", "post_attention_layernorm.weight"):
            _need(layer, path, f"layer {i}")
    _need(inner, "embed_tokens.weight", "model.model")
    _need(inner, "norm.weight", "model.model")
    _need(model, "lm_head.weight", "the model")
    plugin.plugin_fields(CrispConfig(), heads, kv, head_dim)  # the plugin's head limits (ValueError names them)
    dtype = inner.embed_tokens.weight.dtype
    if dtype not in _DTYPES:
        raise BuildError(f"unsupported weights dtype {dtype}: expected float32, float16 or bfloat16")
    return ModelSpec(archs[0], len(layers), heads, kv, head_dim, int(cfg.hidden_size),
                     float(getattr(cfg, "rms_norm_eps", 1e-6)), rotary.inv_freq.detach().float().cpu(),
                     float(getattr(rotary, "attention_scaling", 1.0)), dtype)


def _tensor_types():
    onnx = _onnx()
    return {torch.float32: onnx.TensorProto.FLOAT, torch.float16: onnx.TensorProto.FLOAT16,
            torch.bfloat16: onnx.TensorProto.BFLOAT16, torch.int32: onnx.TensorProto.INT32,
            torch.int64: onnx.TensorProto.INT64}


_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class _Graph:
    """Nodes and initializers of one graph; weights are appended to one external-data file as they come."""

    ALIGN = 64

    def __init__(self, data_path: Path):
        self.onnx = _onnx()
        self.types = _tensor_types()
        self.nodes, self.initializers = [], []
        self._counts: Counter = Counter()
        self._weights: dict = {}
        self._consts: dict = {}
        self._data_path = data_path
        self._data = open(data_path, "wb")
        self._offset = 0

    def close(self) -> None:
        self._data.close()

    def fresh(self, base: str) -> str:
        self._counts[base] += 1
        return base if self._counts[base] == 1 else f"{base}_{self._counts[base] - 1}"

    def op(self, op_type: str, inputs: list[str], name: str | None = None, domain: str = "", **attrs) -> str:
        out = self.fresh(name or op_type.lower())
        self.nodes.append(self.onnx.helper.make_node(op_type, inputs, [out], name=f"{op_type}:{out}",
                                                     domain=domain, **attrs))
        return out

    def weight(self, name: str, tensor: torch.Tensor) -> str:
        """An initializer in external data; one tensor (tied embeddings) is stored once."""
        key = (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype)
        if key in self._weights:
            return self._weights[key]
        data = tensor.detach().contiguous().cpu()
        pad = -self._offset % self.ALIGN
        self._data.write(b"\0" * pad)
        self._offset += pad
        raw = data.reshape(-1).view(torch.uint8).numpy()
        self._data.write(raw.data)
        proto = self.onnx.TensorProto(name=name, data_type=self.types[data.dtype], dims=list(data.shape))
        proto.data_location = self.onnx.TensorProto.EXTERNAL
        for field, value in (("location", self._data_path.name), ("offset", self._offset), ("length", raw.nbytes)):
            proto.external_data.add(key=field, value=str(value))
        self._offset += raw.nbytes
        self.initializers.append(proto)
        self._weights[key] = name
        return name

    def const(self, values, dtype: torch.dtype) -> str:
        """A small constant (inline initializer), shared between uses."""
        t = torch.as_tensor(values, dtype=dtype)
        key = (tuple(t.reshape(-1).tolist()), tuple(t.shape), dtype)
        if key not in self._consts:
            name = self.fresh("const")
            proto = self.onnx.helper.make_tensor(name, self.types[dtype], list(t.shape),
                                                 t.reshape(-1).view(torch.uint8).numpy().tobytes(), raw=True)
            self.initializers.append(proto)
            self._consts[key] = name
        return self._consts[key]


def _linear(g: _Graph, x: str, module, name: str) -> str:
    """x [rows, in] @ W^T (+ b) as one Gemm with transB (the weight is stored as transformers holds it)."""
    inputs = [x, g.weight(f"{name}.weight", module.weight)]
    if getattr(module, "bias", None) is not None:
        inputs.append(g.weight(f"{name}.bias", module.bias))
    return g.op("Gemm", inputs, name=name, transB=1)


def _rms_norm(g: _Graph, x: str, weight: torch.Tensor, eps: float, dtype: torch.dtype, name: str) -> str:
    """transformers' LlamaRMSNorm: in float32, x · rsqrt(mean(x²) + eps), cast back, times the weight."""
    f32 = dtype != torch.float32
    xf = g.op("Cast", [x], to=g.types[torch.float32]) if f32 else x
    var = g.op("ReduceMean", [g.op("Mul", [xf, xf])], axes=[-1], keepdims=1)
    inv = g.op("Reciprocal", [g.op("Sqrt", [g.op("Add", [var, g.const([eps], torch.float32)])])])
    y = g.op("Mul", [xf, inv])
    y = g.op("Cast", [y], to=g.types[dtype]) if f32 else y
    return g.op("Mul", [g.weight(f"{name}.weight", weight), y], name=name)


def _rope_tables(g: _Graph, spec: ModelSpec, cu: str, ends: str) -> tuple[str, str]:
    """cos, sin [tokens, 1, head_dim] in the graph dtype, positions restarting at each sequence's start."""
    i64, i32, f32 = torch.int64, torch.int32, torch.float32
    tokens = g.op("Gather", [g.op("Shape", ["input_ids"]), g.const(0, i64)], axis=0)
    r = g.op("Cast", [g.op("Range", [g.const(0, i64), tokens, g.const(1, i64)])], to=g.types[i32])
    axis0, axis1 = g.const([0], i64), g.const([1], i64)
    ge = g.op("GreaterOrEqual", [g.op("Unsqueeze", [r, axis1]), g.op("Unsqueeze", [ends, axis0])])  # [T, B]
    seq = g.op("ReduceSum", [g.op("Cast", [ge], to=g.types[f32]), axis1], keepdims=0)
    start = g.op("Gather", [cu, g.op("Cast", [seq], to=g.types[i32])], axis=0)
    pos = g.op("Cast", [g.op("Sub", [r, start])], to=g.types[f32], name="positions")
    freqs = g.op("Mul", [g.op("Unsqueeze", [pos, axis1]), g.weight("rope.inv_freq", spec.inv_freq)])
    emb = g.op("Concat", [freqs, freqs], axis=-1)
    tables = []
    for fn in ("Cos", "Sin"):
        t = g.op(fn, [emb])
        if spec.attention_scaling != 1.0:
            t = g.op("Mul", [t, g.const([spec.attention_scaling], f32)])
        if spec.dtype != f32:
            t = g.op("Cast", [t], to=g.types[spec.dtype])
        tables.append(g.op("Unsqueeze", [t, axis1], name=f"rope_{fn.lower()}"))
    return tables[0], tables[1]


def _rotate(g: _Graph, x: str, cos: str, sin: str, half: int) -> str:
    """x · cos + rotate_half(x) · sin on the last axis (transformers' apply_rotary_pos_emb)."""
    i64 = torch.int64
    axis = g.const([-1], i64)
    x1 = g.op("Slice", [x, g.const([0], i64), g.const([half], i64), axis])
    x2 = g.op("Slice", [x, g.const([half], i64), g.const([2 * half], i64), axis])
    rotated = g.op("Concat", [g.op("Neg", [x2]), x1], axis=-1)
    return g.op("Add", [g.op("Mul", [x, cos]), g.op("Mul", [rotated, sin])])


def _layer_configs(configs, num_layers: int) -> list[CrispConfig]:
    if configs is None or isinstance(configs, CrispConfig):
        return [configs or CrispConfig()] * num_layers
    configs = list(configs)
    if len(configs) != num_layers or not all(isinstance(c, CrispConfig) for c in configs):
        raise BuildError(f"configs: expected one CrispConfig or a list of {num_layers} (one per layer), "
                         f"got {len(configs)} items")
    return configs


def export(model, path: str | Path, configs: CrispConfig | list[CrispConfig] | None = None) -> Path:
    """Write the model's CRISP prefill graph to `path` (.onnx) and its weights to `path` + ".data".

    configs: one CrispConfig for every layer or one per layer (a crisp-build artifact's calibrated ones).
    The graph computes in the model's weight dtype (load it in float16 / bfloat16 for a TensorRT engine:
    the plugin takes those; float32 is for checking the graph on the CPU). Returns `path`."""
    spec = describe(model)
    configs = _layer_configs(configs, spec.num_layers)
    onnx = _onnx()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    g = _Graph(path.with_name(path.name + ".data"))
    try:
        outputs = _build(g, model, spec, configs)
    finally:
        g.close()
    i32 = onnx.TensorProto.INT32
    inputs = [onnx.helper.make_tensor_value_info("input_ids", i32, ["tokens"]),
              onnx.helper.make_tensor_value_info("cu_seqlens", i32, ["batch_plus_1"])]
    kv_shape = ["tokens", spec.num_kv_heads, spec.head_dim]
    vocab = int(model.lm_head.weight.shape[0])
    outs = [onnx.helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["batch", vocab])]
    outs += [onnx.helper.make_tensor_value_info(name, g.types[spec.dtype], kv_shape) for name in outputs[1:]]
    graph = onnx.helper.make_graph(g.nodes, "crisp_prefill", inputs, outs, initializer=g.initializers)
    proto = onnx.helper.make_model(graph, producer_name="crisp-trt",
                                   opset_imports=[onnx.helper.make_opsetid("", OPSET),
                                                  onnx.helper.make_opsetid(plugin.ONNX_DOMAIN, int(plugin.VERSION))])
    proto.ir_version = 8  # opset 17; read by TensorRT 10 / RTX 1.x parsers and onnxruntime
    onnx.save_model(proto, str(path))
    onnx.checker.check_model(str(path))  # by path: the checker then sees the external data too
    return path


def _build(g: _Graph, model, spec: ModelSpec, configs: list[CrispConfig]) -> list[str]:
    i64 = torch.int64
    inner = model.model
    cu = "cu_seqlens"
    ends = g.op("Slice", [cu, g.const([1], i64), g.const([2 ** 62], i64), g.const([0], i64)], name="seq_ends")
    cos, sin = _rope_tables(g, spec, cu, ends)
    h = g.op("Gather", [g.weight("embed_tokens.weight", inner.embed_tokens.weight), "input_ids"], axis=0,
             name="embed")
    q_shape = g.const([-1, spec.num_heads, spec.head_dim], i64)
    kv_shape = g.const([-1, spec.num_kv_heads, spec.head_dim], i64)
    flat = g.const([-1, spec.num_heads * spec.head_dim], i64)
    outputs = ["logits"]
    for i, layer in enumerate(inner.layers):
        p, attn = f"layers.{i}", layer.self_attn
        x = _rms_norm(g, h, layer.input_layernorm.weight, spec.eps, spec.dtype, f"{p}.input_layernorm")
        q = g.op("Reshape", [_linear(g, x, attn.q_proj, f"{p}.q_proj"), q_shape])
        k = g.op("Reshape", [_linear(g, x, attn.k_proj, f"{p}.k_proj"), kv_shape])
        v = g.op("Reshape", [_linear(g, x, attn.v_proj, f"{p}.v_proj"), kv_shape])
        q = _rotate(g, q, cos, sin, spec.head_dim // 2)
        k = _rotate(g, k, cos, sin, spec.head_dim // 2)
        key = g.op("Identity", [k], name=f"present.{i}.key")
        value = g.op("Identity", [v], name=f"present.{i}.value")
        outputs += [key, value]
        attrs = plugin.onnx_attributes(configs[i], spec.num_heads, spec.num_kv_heads, spec.head_dim)
        a = g.op(plugin.NAME, [q, k, v, cu], name=f"{p}.crisp", domain=plugin.ONNX_DOMAIN, **attrs)
        h = g.op("Add", [h, _linear(g, g.op("Reshape", [a, flat]), attn.o_proj, f"{p}.o_proj")])
        x = _rms_norm(g, h, layer.post_attention_layernorm.weight, spec.eps, spec.dtype, f"{p}.post_attention_layernorm")
        gate = _linear(g, x, layer.mlp.gate_proj, f"{p}.gate_proj")
        act = g.op("Mul", [g.op("Mul", [gate, g.op("Sigmoid", [gate])]), _linear(g, x, layer.mlp.up_proj, f"{p}.up_proj")])
        h = g.op("Add", [h, _linear(g, act, layer.mlp.down_proj, f"{p}.down_proj")])
    h = _rms_norm(g, h, inner.norm.weight, spec.eps, spec.dtype, "norm")
    last = g.op("Gather", [h, g.op("Sub", [ends, g.const([1], torch.int32)])], axis=0, name="last_hidden")
    head = model.lm_head
    if head.weight.dtype != spec.dtype:  # a float32 LM head on a half model (crisp_trt.models.Float32Logits)
        last = g.op("Cast", [last], to=g.types[head.weight.dtype])
    logits = _linear(g, last, head, "lm_head")
    if head.weight.dtype != torch.float32:
        logits = g.op("Cast", [logits], to=g.types[torch.float32])
    g.nodes.append(g.onnx.helper.make_node("Identity", [logits], ["logits"], name="Identity:logits"))
    return outputs
