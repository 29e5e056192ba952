"""crisp-build: CLI parsing and errors (fast), then one real end-to-end build of SmolLM2 (slow, CPU)."""
import json
import subprocess
import sys

import pytest

from crisp_trt.builder import cli
from crisp_trt.builder.calibrate import calibrate_layer, calibration_text
from crisp_trt.config import CrispConfig


@pytest.mark.parametrize("text,value", [("8k", 8192), ("512k", 524288), ("1M", 1048576), ("131072", 131072),
                                        ("4K", 4096), ("1m", 1048576)])
def test_parse_length(text, value):
    assert cli.parse_length(text) == value


@pytest.mark.parametrize("bad", ["", "k", "1.5k", "-8k", "0", "8kb", "12x"])
def test_parse_length_rejects(bad):
    with pytest.raises(ValueError):
        cli.parse_length(bad)


def test_help_lists_options(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = capsys.readouterr().out
    for flag in ("--model", "--max-seq", "--output", "--backend", "--dtype", "--calibrate", "--tp", "--triton-repo",
                 "--rope-scaling"):
        assert flag in text


def _err(capsys, argv):
    assert cli.main(argv) == 2
    return capsys.readouterr().err


def test_missing_checkpoint(capsys, tmp_path):
    assert "no such file or directory" in _err(capsys, ["--model", str(tmp_path / "nope"), "--backend", "torch"])


def test_dir_without_config(capsys, tmp_path):
    assert "no config.json" in _err(capsys, ["--model", str(tmp_path), "--backend", "torch"])


def test_invalid_config_json(capsys, tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    assert "not valid JSON" in _err(capsys, ["--model", str(tmp_path), "--backend", "torch"])


def test_no_safetensors(capsys, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert "safetensors" in _err(capsys, ["--model", str(tmp_path), "--backend", "torch"])


def test_unsupported_architecture(capsys, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    err = _err(capsys, ["--model", str(tmp_path), "--backend", "torch"])
    assert "unsupported architecture" in err and "LlamaForCausalLM" in err and "GQA" in err


def test_bad_gguf(capsys, tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"not a gguf file at all")
    assert "not a valid GGUF" in _err(capsys, ["--model", str(bad), "--backend", "torch"])


def test_max_seq_beyond_rope():
    cfg = {"max_position_embeddings": 8192}
    with pytest.raises(cli.BuildError, match="--rope-scaling"):
        cli.check_max_seq(cli.parse_length("512k"), cfg, None)
    assert cli.check_max_seq(8192, cfg, None) == (8192, None)
    seq, scaling = cli.check_max_seq(cli.parse_length("32k"), cfg, "linear:4")
    assert seq == 32768 and scaling == {"rope_type": "linear", "factor": 4.0}
    with pytest.raises(cli.BuildError, match="TYPE:FACTOR"):
        cli.check_max_seq(8192, cfg, "bogus")


def test_max_seq_yarn_qwen():
    """Qwen2.5: 32768 native × yarn:4 = 131072 tokens; one token more names --rope-scaling."""
    cfg = {"max_position_embeddings": 32768}
    seq, scaling = cli.check_max_seq(cli.parse_length("128k"), cfg, "yarn:4")
    assert seq == 131072
    assert scaling == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    with pytest.raises(cli.BuildError, match=r"32768 × rope_scaling factor 4 = 131072 tokens.*--rope-scaling"):
        cli.check_max_seq(131073, cfg, "yarn:4")
    with pytest.raises(cli.BuildError, match="--rope-scaling"):
        cli.check_max_seq(cli.parse_length("64k"), cfg, None)
    assert cli.check_max_seq(None, cfg, "yarn:4")[0] == 131072
    # a checkpoint that already carries YaRN (transformers 5 writes rope_parameters)
    saved = {"max_position_embeddings": 32768, "rope_parameters": {"rope_type": "yarn", "factor": 4.0}}
    assert cli.check_max_seq(cli.parse_length("128k"), saved, None)[0] == 131072
    for bad in ("yarn:0.5", "ntk:4", "yarn"):
        with pytest.raises(cli.BuildError, match="--rope-scaling.*TYPE:FACTOR"):
            cli.check_max_seq(8192, cfg, bad)


def test_hf_qwen2_checkpoint_is_accepted(tmp_path):
    from crisp_trt.builder import checkpoint

    cfg = {"architectures": ["Qwen2ForCausalLM"], "num_attention_heads": 14, "num_key_value_heads": 2,
           "max_position_embeddings": 32768}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert checkpoint.inspect_checkpoint(tmp_path)["num_key_value_heads"] == 2
    cfg["architectures"] = ["Qwen2MoeForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(checkpoint.BuildError, match="unsupported architecture: 'Qwen2MoeForCausalLM'"):
        checkpoint.inspect_checkpoint(tmp_path)


def _gguf(path, arch, **fields):
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(path), arch)
    for name, value in fields.items():
        key = f"{arch}.{name}"
        (writer.add_float32 if isinstance(value, float) else writer.add_uint32)(key, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_qwen2_header_is_read(tmp_path):
    """A qwen2 GGUF header (the bundled Qwen's fields, no tensors) reads as Qwen2ForCausalLM."""
    from crisp_trt.builder import checkpoint

    path = _gguf(tmp_path / "q.gguf", "qwen2", block_count=24, context_length=32768, embedding_length=896,
                 **{"attention.head_count": 14, "attention.head_count_kv": 2, "rope.freq_base": 1e6})
    cfg = checkpoint.inspect_checkpoint(path)
    assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["num_hidden_layers"] == 24
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["max_position_embeddings"]) == (14, 2, 32768)
    assert cfg["rope_theta"] == 1e6
    other = _gguf(tmp_path / "g.gguf", "gpt2", block_count=2)
    with pytest.raises(checkpoint.BuildError, match="GGUF architecture 'gpt2'.*llama, qwen2"):
        checkpoint.inspect_checkpoint(other)


def test_checkpoint_module_has_no_cycle():
    """checkpoint.py imports none of cli / artifact / engine (the old cli → artifact → engine → cli circle)."""
    import ast
    from pathlib import Path

    import crisp_trt.builder.checkpoint as checkpoint

    tree = ast.parse(Path(checkpoint.__file__).read_text())
    relative = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level}
    assert not relative & {"cli", "artifact", "engine"}
    assert not hasattr(cli, "_smollm2_path")
    engine_src = Path(checkpoint.__file__).with_name("engine.py").read_text()
    assert "from .cli" not in engine_src and "TensorRTMissing" not in engine_src and "plugin_library" not in engine_src


def test_tensorrt_backend_missing_is_clear(capsys, tmp_path):
    """Without a TensorRT builder (or the plugin), --backend tensorrt fails before loading, naming what to install."""
    from crisp_trt.builder.engine import tensorrt_available

    if tensorrt_available():
        pytest.skip("a TensorRT builder and the plugin library are installed here")
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"],
                                                      "num_attention_heads": 4, "max_position_embeddings": 4096}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    err = _err(capsys, ["--model", str(tmp_path), "--backend", "tensorrt", "--output", str(tmp_path / "out")])
    assert "--backend tensorrt" in err
    assert "tensorrt-rtx-cu13-libs tensorrt-rtx-cu13-bindings" in err or "build_plugin.sh" in err
    assert not (tmp_path / "out").exists()


def test_bad_max_batch(capsys, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"],
                                                      "num_attention_heads": 4, "max_position_embeddings": 4096}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert "--max-batch 0: expected >= 1" in _err(capsys, ["--model", str(tmp_path), "--max-batch", "0"])


def test_calibrate_layer_deterministic_and_meets_recall():
    import torch

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(512, 4, 32, generator=g), torch.randn(512, 2, 32, generator=g)
    k[:4] *= 4  # a sink
    base = CrispConfig(block_size=64, min_budget=64)
    a, b = calibrate_layer(q, k, base), calibrate_layer(q, k, base)
    assert a == b
    assert a["met"] and a["recall"] >= 0.98
    assert set(a["heads"]) >= {"noise_floor", "sink_mass", "local_mass", "c_struct"}
    assert calibration_text(300, 1) == calibration_text(300, 1)
    assert a["kappa"] <= base.kappa  # never sparser than the default
    loose = calibrate_layer(q, k, base.replace(kappa=3.0))
    assert loose["kappa"] in (1.0, 2.0, 3.0)


# ---- the real model, end to end (one build per module) ----------------------------------------------

@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    try:
        cli.default_model()
    except cli.BuildError as exc:
        pytest.skip(str(exc))
    out = tmp_path_factory.mktemp("art") / "smollm2"
    rc = cli.main(["--output", str(out), "--backend", "torch", "--calibrate", "256", "--no-progress"])
    assert rc == 0
    return out


@pytest.mark.slow
def test_build_writes_calibrated_config(artifact):
    cfg = json.loads((artifact / "config.json").read_text())
    crisp = cfg["crisp"]
    assert cfg["num_hidden_layers"] == 30 and cfg["num_key_value_heads"] == 3
    assert crisp["backend"] == "torch" and crisp["max_seq"] == 8192
    CrispConfig.from_dict(crisp["config"])
    assert len(crisp["layers"]) == 30 and len(crisp["calibration"]["layers"]) == 30
    cal = crisp["calibration"]
    for layer in cal["layers"]:
        assert len(layer["heads"]["c_struct"]) == 9
        assert (not layer["met"]) or layer["recall"] >= 0.98
    assert list(artifact.glob("*.safetensors"))


@pytest.mark.slow
def test_crisp_run_answers(artifact):
    from crisp_trt import runtime

    model = runtime.load(artifact)
    gen = model.generate("The capital of France is", max_new_tokens=6)
    assert gen.ttft_s > 0 and len(gen.token_ids) >= 1 and gen.text.strip()
    dense = runtime.load(artifact, attention="dense").generate("The capital of France is", max_new_tokens=6)
    assert dense.text == gen.text  # a short prompt is below dense_below: identical by construction
    proc = subprocess.run([sys.executable, "-m", "crisp_trt.runtime", str(artifact), "--prompt", "Hello",
                           "--max-new-tokens", "4"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "TTFT" in proc.stderr


@pytest.mark.slow
def test_runtime_prefill_goes_through_crisp(artifact, monkeypatch):
    """With dense_below=0 a 256-token prompt really runs CRISP in every layer, close to dense."""
    import torch

    from crisp_trt import hf, runtime

    model = runtime.load(artifact)
    calls = []
    real = hf.crisp_prefill_attention
    monkeypatch.setattr(hf, "crisp_prefill_attention", lambda *a, **k: calls.append(k["config"]) or real(*a, **k))
    configs = [c.replace(dense_below=0) for c in model.layer_configs]
    hf.set_crisp_config(model.model, configs)
    ids = model.tokenizer(calibration_text(256, 3), return_tensors="pt").input_ids[:, :256]
    with torch.no_grad():
        sparse = model.model(input_ids=ids).logits[0, -1].float()
        model.set_attention("dense")
        dense = model.model(input_ids=ids).logits[0, -1].float()
    assert len(calls) == 30 and [c.kappa for c in calls] == [c.kappa for c in configs]  # layer i gets config i
    kl = torch.nn.functional.kl_div(sparse.log_softmax(-1), dense.log_softmax(-1), log_target=True, reduction="sum")
    assert float(kl) < 0.5


@pytest.mark.slow
def test_e2e_bench_on_the_artifact(artifact, tmp_path):
    """crisp-bench e2e on the CPU at 1100 tokens (≥ dense_below, so CRISP really runs): TTFTs, the per-prompt
    identity records and their totals, and the JSON on disk."""
    from crisp_trt import hf
    from crisp_trt.bench.e2e import run_e2e

    before = hf.CALLS["crisp"]
    res = run_e2e(artifact, [1100], tmp_path, repeats=1, warmup=0, trials=2, new_tokens=3, device="cpu", plot=False)
    assert hf.CALLS["crisp"] - before >= 30  # every layer of at least one CRISP prefill
    (row,) = res["rows"]
    assert row["ttft_dense_ms"] > 0 and row["ttft_crisp_ms"] > 0 and row["trials"] == 2
    prompts = row["prompts"]
    assert [p["trial"] for p in prompts] == [0, 1]
    assert row["identical_to_dense"] == sum(p["identical"] for p in prompts)
    assert row["retrieved_crisp"] == sum(p["retrieved_crisp"] for p in prompts)
    assert row["identical_control"] == sum(p["identical_control"] for p in prompts)
    for p in prompts:
        assert ("diverge_at" in p) == ("dense_gap" in p)
        assert "diverge_at" not in p or (0 <= p["diverge_at"] < 3 and p["dense_gap"] >= 0)
        assert p["identical"] or "diverge_at" in p  # different text needs different tokens
    assert json.loads((tmp_path / "e2e.json").read_text())["rows"][0]["prompts"] == prompts


@pytest.mark.slow
def test_artifact_exports_its_calibrated_layers(artifact, tmp_path):
    """crisp-build --backend tensorrt's export step on the artifact: one CrispPrefillAttention per layer, each
    with that layer's calibrated kappa/tau, in the engine dtype (bf16)."""
    onnx = pytest.importorskip("onnx")
    from crisp_trt import plugin
    from crisp_trt.builder.engine import export_artifact

    path = export_artifact(artifact, tmp_path / "model.onnx", "bf16")
    layers = json.loads((artifact / "config.json").read_text())["crisp"]["layers"]
    nodes = [n for n in onnx.load(str(path), load_external_data=False).graph.node if n.op_type == plugin.NAME]
    assert len(nodes) == 30
    for node, layer in zip(nodes, layers):
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["kappa"] == pytest.approx(layer["kappa"]) and attrs["tau"] == pytest.approx(layer["tau"])


def test_bundled_model_names(monkeypatch):
    """--model smollm2 / qwen name the bundled models; a missing one says what to install, naming --model."""
    from crisp_trt import models

    assert cli.default_model("smollm2") == cli.default_model(None)
    assert cli.default_model("/some/dir") == "/some/dir"

    def missing():
        raise FileNotFoundError(models.QWEN_HINT)
    monkeypatch.setitem(models.BUNDLED, "qwen", missing)
    with pytest.raises(cli.BuildError, match=r"--model qwen: the bundled model is not installed.*\.\[qwen\]"):
        cli.default_model("qwen")
