"""The exported CRISP prefill graph (builder/onnx_export.py), shown right on the CPU: onnxruntime runs it with
the CrispPrefillAttention node bound to the CPU op (builder/onnx_cpu.py), and its last-token logits and per-layer
K/V must equal transformers' forward under attn_implementation="crisp" with the same CrispConfig — tiny random
Llama / Qwen2 models (packed varlen batches, per-layer configs), SmolLM2 at 2048 tokens, and the Qwen model
where it is installed."""
import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
onnx = pytest.importorskip("onnx")

from crisp_trt import CrispConfig, hf, plugin  # noqa: E402
from crisp_trt.builder import onnx_export  # noqa: E402
from crisp_trt.builder.checkpoint import BuildError  # noqa: E402


def _ort():
    pytest.importorskip("onnxruntime", reason="running the graph needs onnxruntime (the test extra)")
    pytest.importorskip("onnxruntime_extensions", reason="the CRISP node binds through onnxruntime-extensions")
    from crisp_trt.builder import onnx_cpu

    return onnx_cpu


def _tiny(kind="llama", layers=2, **changes):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[kind]
    shape = dict(vocab_size=320, hidden_size=256, intermediate_size=512, num_hidden_layers=layers,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096)
    cfg = cls(**{**shape, **changes})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="crisp").eval()
    if kind == "qwen2":  # random biases (from_config zeroes them), so a lost bias shows
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                torch.nn.init.normal_(proj.bias, std=0.5)
    return model


def _hf_reference(model, ids):
    """(last-token logits, [(K, V) per layer] as [tokens, kv_heads, d]) of transformers' own forward."""
    with torch.no_grad():
        out = model(input_ids=ids[None], use_cache=True)
    cache = getattr(out, "cache", None) or out.past_key_values
    kv = [(layer.keys[0].transpose(0, 1), layer.values[0].transpose(0, 1)) for layer in cache.layers]
    return out.logits[0, -1].float(), kv


def _compare(model, outputs, ids, cu, tol):
    """Per sequence of the packed batch: ONNX logits / K / V vs transformers on that sequence alone."""
    worst = {"logits": 0.0, "kv": 0.0}
    for b, (start, end) in enumerate(zip(cu[:-1], cu[1:])):
        logits, kv = _hf_reference(model, ids[start:end])
        got = torch.from_numpy(outputs["logits"][b])
        worst["logits"] = max(worst["logits"], float((got - logits).abs().max()))
        assert int(got.argmax()) == int(logits.argmax())
        for i, (k, v) in enumerate(kv):
            for name, ref in (("key", k), ("value", v)):
                diff = float((torch.from_numpy(outputs[f"present.{i}.{name}"][start:end]) - ref).abs().max())
                worst["kv"] = max(worst["kv"], diff)
    assert worst["logits"] <= tol and worst["kv"] <= tol, worst
    return worst


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_tiny_model_graph_equals_transformers(kind, tmp_path):
    """Two packed sequences (700 + 300 tokens), CRISP sparse in every layer (dense_below 0, block 64), a
    different config per layer: logits and every layer's K/V equal the HF forward of each sequence."""
    onnx_cpu = _ort()
    model = _tiny(kind)
    configs = [CrispConfig(block_size=64, dense_below=0, min_budget=64, kappa=k) for k in (8.0, 2.0)]
    hf.set_crisp_config(model, configs)
    path = onnx_export.export(model, tmp_path / "m.onnx", configs)
    sess = onnx_cpu.session(path)
    ids = torch.randint(0, 320, (1000,), generator=torch.Generator().manual_seed(1))
    cu = [0, 700, 1000]
    before = hf.CALLS["crisp"]
    outputs = onnx_cpu.run(sess, ids, cu)
    _compare(model, outputs, ids, cu, tol=1e-4)
    assert hf.CALLS["crisp"] - before == 2 * 2  # both sequences went through CRISP in both layers
    assert outputs["logits"].shape == (2, 320) and outputs["present.1.key"].shape == (1000, 2, 64)


def test_graph_structure(tmp_path):
    """One CrispPrefillAttention per layer (domain crisp v1, the plugin's fields of that layer's config as
    attributes, plugin_namespace/plugin_version for TensorRT's parser), packed inputs, the documented outputs."""
    model = _tiny("qwen2", layers=3)
    configs = [CrispConfig(kappa=float(2 ** i), tau=0.25 * i) for i in range(3)]
    path = onnx_export.export(model, tmp_path / "m.onnx", configs)
    proto = onnx.load(str(path), load_external_data=False)
    onnx.checker.check_model(str(path))
    nodes = [n for n in proto.graph.node if n.op_type == plugin.NAME]
    assert len(nodes) == 3 and all(n.domain == "crisp" for n in nodes)
    assert {(o.domain, o.version) for o in proto.opset_import} == {("", onnx_export.OPSET), ("crisp", 1)}
    for node, cfg in zip(nodes, configs):
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
        assert attrs == pytest.approx(plugin.onnx_attributes(cfg, 4, 2, 64))
        assert plugin.config_of_attributes(attrs) == (cfg, 4, 2, 64)
        assert list(node.input)[3] == "cu_seqlens"
    assert [i.name for i in proto.graph.input] == list(onnx_export.INPUTS)
    assert [o.name for o in proto.graph.output] == onnx_export.output_names(3)
    assert {n.domain for n in proto.graph.node} == {"", "crisp"}
    assert (tmp_path / "m.onnx.data").stat().st_size > 3 * 256 * 256 * 4  # the weights live outside the proto


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_graph_types(dtype, tmp_path):
    """The engine graphs: weights and K/V in the half dtype (what the plugin takes), logits float32."""
    model = _tiny("llama").to(dtype)
    path = onnx_export.export(model, tmp_path / "m.onnx")
    proto = onnx.load(str(path), load_external_data=False)
    half = {torch.float16: onnx.TensorProto.FLOAT16, torch.bfloat16: onnx.TensorProto.BFLOAT16}[dtype]
    weights = {t.name: t.data_type for t in proto.graph.initializer if t.name.endswith(".weight")}
    assert set(weights.values()) == {half}
    outs = {o.name: o.type.tensor_type.elem_type for o in proto.graph.output}
    assert outs["logits"] == onnx.TensorProto.FLOAT and outs["present.0.key"] == half


def test_unsupported_and_malformed_models_are_named(tmp_path):
    from transformers import AutoModelForCausalLM, GPT2Config

    gpt2 = AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_embd=64, n_head=1, vocab_size=50,
                                                                 bos_token_id=0, eos_token_id=0))
    with pytest.raises(BuildError, match="unsupported architecture: 'GPT2LMHeadModel'.*Qwen2ForCausalLM"):
        onnx_export.export(gpt2, tmp_path / "g.onnx")
    sliding = _tiny("qwen2", use_sliding_window=True, sliding_window=128, max_window_layers=1)
    with pytest.raises(BuildError, match=r"layers \[1\] use \['sliding_attention'\]"):
        onnx_export.export(sliding, tmp_path / "s.onnx")
    dynamic = _tiny("llama", rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    with pytest.raises(BuildError, match="rope_type='dynamic'"):
        onnx_export.export(dynamic, tmp_path / "d.onnx")
    with pytest.raises(BuildError, match="hidden_act='gelu'"):
        onnx_export.export(_tiny("llama", hidden_act="gelu"), tmp_path / "a.onnx")
    broken = _tiny("llama")
    del broken.model.layers[1].self_attn.q_proj
    with pytest.raises(BuildError, match="malformed model: layer 1 self_attn has no q_proj.weight"):
        onnx_export.export(broken, tmp_path / "b.onnx")
    with pytest.raises(BuildError, match="configs: expected one CrispConfig or a list of 2"):
        onnx_export.export(_tiny("llama"), tmp_path / "c.onnx", [CrispConfig()] * 3)
    small = _tiny("llama", head_dim=32)
    with pytest.raises(ValueError, match="head_dim=32"):
        onnx_export.export(small, tmp_path / "h.onnx")


# ---- real models: one load per module ---------------------------------------------------------------------

def _real(path_fn, tmp_path_factory, tokens):
    """Load the model once (fp32, CRISP with the default config), export it, run both at `tokens`."""
    from crisp_trt.builder.calibrate import calibration_text
    from crisp_trt.models import load_model

    onnx_cpu = _ort()
    try:
        path = path_fn()
    except (ImportError, FileNotFoundError) as exc:
        pytest.skip(f"model not installed: {exc}")
    cfg = CrispConfig()
    model, tok = load_model(path, "crisp", crisp_config=cfg, dtype=torch.float32)
    ids = tok(calibration_text(tokens * 2, 5), return_tensors="pt").input_ids[0, :tokens]
    assert ids.numel() == tokens
    graph = onnx_export.export(model, tmp_path_factory.mktemp("onnx") / "model.onnx", cfg)
    calls, op = [], onnx_cpu.crisp_prefill_attention
    onnx_cpu.crisp_prefill_attention = lambda *a, **k: calls.append(k["config"]) or op(*a, **k)
    try:
        outputs = onnx_cpu.run(onnx_cpu.session(graph), ids, [0, tokens])
    finally:
        onnx_cpu.crisp_prefill_attention = op
    return model, ids, outputs, len(calls)


@pytest.mark.slow
def test_smollm2_graph_equals_transformers_at_2k(tmp_path_factory):
    """SmolLM2-135M (30 layers, 9/3 heads) at 2048 tokens, float32, the default CrispConfig: the graph's
    last-token logits and K/V equal transformers' CRISP forward to float32 rounding."""
    from crisp_trt.models import smollm2_path

    model, ids, outputs, calls = _real(smollm2_path, tmp_path_factory, 2048)
    assert calls == 30  # the ONNX run's 30 CRISP nodes each called the op
    before = hf.CALLS["crisp"]
    worst = _compare(model, outputs, ids, [0, 2048], tol=2e-3)
    assert hf.CALLS["crisp"] - before == 30  # and transformers ran CRISP (2048 >= dense_below) in every layer
    print(f"SmolLM2 2048 tokens: max |logit diff| {worst['logits']:.2e}, max |K/V diff| {worst['kv']:.2e}")


def _qwen_path():
    from crisp_trt import models

    if not hasattr(models, "qwen_path"):
        raise FileNotFoundError("crisp_trt.models.qwen_path is not there yet")
    return models.qwen_path()


@pytest.mark.slow
def test_qwen_graph_equals_transformers(tmp_path_factory):
    """Qwen2.5-Coder-0.5B (qwen2, q/k/v biases, 24 layers, 14/2 heads) at 2048 tokens, float32."""
    model, ids, outputs, calls = _real(_qwen_path, tmp_path_factory, 2048)
    assert calls == 24
    before = hf.CALLS["crisp"]
    worst = _compare(model, outputs, ids, [0, 2048], tol=5e-3)
    assert hf.CALLS["crisp"] - before == 24
    print(f"Qwen 2048 tokens: max |logit diff| {worst['logits']:.2e}, max |K/V diff| {worst['kv']:.2e}")
    assert np.isfinite(outputs["logits"]).all()


@pytest.mark.parametrize("attr,value", [("return_lse", 1), ("chunked", 1)])
def test_cpu_session_refuses_other_inputs_and_outputs(tmp_path, attr, value):
    """A node with the chunked input set or the LSE output is not the PyOp's q/k/v/cu_seqlens → out: named,
    not run."""
    onnx_cpu = _ort()
    path = onnx_export.export(_tiny("llama", layers=1), tmp_path / "m.onnx", [CrispConfig(block_size=64)])
    proto = onnx.load(str(path), load_external_data=False)
    next(n for n in proto.graph.node if n.op_type == plugin.NAME).attribute.append(
        onnx.helper.make_attribute(attr, value))
    onnx.save(proto, str(path))
    with pytest.raises(BuildError, match=f"sets {attr}="):
        onnx_cpu.session(path)


def test_cpu_session_binds_spike(tmp_path):
    """The spike field reaches the op: a graph exported with spike 0.01 in one layer and absent (off) in the
    other equals transformers with those configs, and differs from the same model with spike off everywhere
    (onnxruntime-extensions drops undeclared attributes: a lost spike would show here)."""
    onnx_cpu = _ort()
    model = _tiny("llama")
    base = dict(block_size=64, dense_below=0, min_budget=64, max_budget=256, coverage=0.5)  # sparse enough to differ
    configs = [CrispConfig(**base, spike=0.0), CrispConfig(**base, spike=0.01)]
    path = onnx_export.export(model, tmp_path / "m.onnx", configs)
    spikes = [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}.get("spike")
              for n in onnx.load(str(path), load_external_data=False).graph.node if n.op_type == plugin.NAME]
    assert spikes == [None, pytest.approx(0.01)]  # off is the absent field
    ids = torch.randint(0, 320, (1000,), generator=torch.Generator().manual_seed(2))
    outputs = onnx_cpu.run(onnx_cpu.session(path), ids, [0, 1000])
    hf.set_crisp_config(model, configs)
    _compare(model, outputs, ids, [0, 1000], tol=1e-4)
    hf.set_crisp_config(model, [configs[0]] * 2)
    off, _ = _hf_reference(model, ids)
    assert float((torch.from_numpy(outputs["logits"][0]) - off).abs().max()) > 1e-2
