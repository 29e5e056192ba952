"""TensorRT-LLM checkpoint conversion: names, shapes, TP sharding (tiny Llama TP=1/2, a tiny random Qwen2 with
q/k/v biases TP=1/2/4, SmolLM2 TP=1/3)."""
import json

import pytest
import torch

safetensors = pytest.importorskip("safetensors.torch")

from crisp_trt.builder.trtllm_checkpoint import convert  # noqa: E402

LAYER_NAMES = ("attention.qkv.weight", "attention.dense.weight", "input_layernorm.weight", "post_layernorm.weight",
               "mlp.fc.weight", "mlp.gate.weight", "mlp.proj.weight")


def _tiny(tmp_path, heads=4, kv=2, d=8, hidden=32, inter=48, vocab=51, layers=2, tie=False):
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    st = {"model.embed_tokens.weight": r(vocab, hidden), "model.norm.weight": r(hidden)}
    if not tie:
        st["lm_head.weight"] = r(vocab, hidden)
    for i in range(layers):
        p = f"model.layers.{i}."
        st.update({p + "self_attn.q_proj.weight": r(heads * d, hidden), p + "self_attn.k_proj.weight": r(kv * d, hidden),
                   p + "self_attn.v_proj.weight": r(kv * d, hidden), p + "self_attn.o_proj.weight": r(hidden, heads * d),
                   p + "mlp.gate_proj.weight": r(inter, hidden), p + "mlp.up_proj.weight": r(inter, hidden),
                   p + "mlp.down_proj.weight": r(hidden, inter), p + "input_layernorm.weight": r(hidden),
                   p + "post_attention_layernorm.weight": r(hidden)})
    safetensors.save_file(st, str(tmp_path / "model.safetensors"))
    cfg = {"architectures": ["LlamaForCausalLM"], "num_attention_heads": heads, "num_key_value_heads": kv,
           "num_hidden_layers": layers, "hidden_size": hidden, "intermediate_size": inter, "vocab_size": vocab,
           "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "head_dim": d,
           "tie_word_embeddings": tie}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return st, cfg


def _check_sharding(st, cfg, out, tp, architecture="LlamaForCausalLM"):
    heads, kv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    tcfg = json.loads((out / "config.json").read_text())
    assert tcfg["architecture"] == architecture and tcfg["mapping"] == {"world_size": tp, "tp_size": tp, "pp_size": 1}
    assert tcfg["num_key_value_heads"] == kv and tcfg["head_size"] == d
    biased = "model.layers.0.self_attn.q_proj.bias" in st
    assert tcfg["attn_bias"] == biased and tcfg["mlp_bias"] is False
    ranks = [safetensors.load_file(str(out / f"rank{r}.safetensors")) for r in range(tp)]
    kv_r = max(kv // tp, 1)
    for r, w in enumerate(ranks):
        expected = {"transformer.vocab_embedding.weight", "transformer.ln_f.weight", "lm_head.weight"}
        names = LAYER_NAMES + (("attention.qkv.bias",) if biased else ())
        expected |= {f"transformer.layers.{i}.{n}" for i in range(cfg["num_hidden_layers"]) for n in names}
        assert set(w) == expected
        p = "model.layers.0."
        qkv = w["transformer.layers.0.attention.qkv.weight"]
        assert qkv.shape == ((heads // tp + 2 * kv_r) * d, cfg["hidden_size"])
        qh, kh = heads // tp * d, kv_r * d
        k_src = r * kv // tp * d  # rank r's kv head: its own share, or (duplicated) head r·kv//tp
        for kind in ("weight", "bias") if biased else ("weight",):
            qkv = w[f"transformer.layers.0.attention.qkv.{kind}"]
            torch.testing.assert_close(qkv[:qh], st[p + f"self_attn.q_proj.{kind}"][r * qh:(r + 1) * qh])
            torch.testing.assert_close(qkv[qh:qh + kh], st[p + f"self_attn.k_proj.{kind}"][k_src:k_src + kh])
            torch.testing.assert_close(qkv[qh + kh:], st[p + f"self_attn.v_proj.{kind}"][k_src:k_src + kh])
        inter = cfg["intermediate_size"] // tp
        torch.testing.assert_close(w["transformer.layers.0.mlp.fc.weight"], st[p + "mlp.gate_proj.weight"][r * inter:(r + 1) * inter])
        torch.testing.assert_close(w["transformer.layers.0.mlp.gate.weight"], st[p + "mlp.up_proj.weight"][r * inter:(r + 1) * inter])
        torch.testing.assert_close(w["transformer.layers.0.mlp.proj.weight"], st[p + "mlp.down_proj.weight"][:, r * inter:(r + 1) * inter])
        torch.testing.assert_close(w["transformer.layers.0.attention.dense.weight"], st[p + "self_attn.o_proj.weight"][:, r * qh:(r + 1) * qh])
    # row-parallel shards concatenate back to the original
    full = torch.cat([w["transformer.layers.1.attention.dense.weight"] for w in ranks], 1)
    torch.testing.assert_close(full, st["model.layers.1.self_attn.o_proj.weight"])
    head = torch.cat([w["lm_head.weight"] for w in ranks])
    src = st.get("lm_head.weight", st["model.embed_tokens.weight"])
    torch.testing.assert_close(head[:src.shape[0]], src)
    assert head.shape[0] % tp == 0 and bool((head[src.shape[0]:] == 0).all())


@pytest.mark.parametrize("tp", [1, 2])
def test_tiny_llama_gqa(tmp_path, tp):
    src = tmp_path / "hf"
    src.mkdir()
    st, cfg = _tiny(src)
    _check_sharding(st, cfg, convert(src, tmp_path / "ckpt", tp=tp), tp)


def test_kv_heads_duplicated_when_fewer_than_tp(tmp_path):
    src = tmp_path / "hf"
    src.mkdir()
    st, cfg = _tiny(src, heads=4, kv=1, tie=True)
    _check_sharding(st, cfg, convert(src, tmp_path / "ckpt", tp=2), 2)


def test_bad_tp(tmp_path):
    src = tmp_path / "hf"
    src.mkdir()
    _tiny(src, heads=4, kv=2)
    with pytest.raises(ValueError, match=r"tp 3: expected one of 1, 2, 4 .*num_attention_heads=4"):
        convert(src, tmp_path / "ckpt", tp=3)


def test_unsupported_architecture(tmp_path):
    src = tmp_path / "hf"
    src.mkdir()
    _tiny(src)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match="architecture GPT2LMHeadModel: expected one of .*Qwen2ForCausalLM"):
        convert(src, tmp_path / "ckpt")


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory):
    """A random-weight Qwen2 (4 q / 2 kv heads, q/k/v biases, tied embeddings) saved as an HF directory."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   tie_word_embeddings=True)
    model = transformers.Qwen2ForCausalLM(cfg)
    for name, param in model.named_parameters():
        if name.endswith("bias"):
            torch.nn.init.normal_(param)  # zero-initialised: make them tell the shards apart
    src = tmp_path_factory.mktemp("qwen2") / "hf"
    model.save_pretrained(src, safe_serialization=True)
    return src


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_tiny_qwen2_biases_sharded(tiny_qwen2, tmp_path, tp):
    """Qwen2's q/k/v biases land in attention.qkv.bias, split like their weights (tp=4: each of the 2 kv heads
    duplicated); the config is TensorRT-LLM's Qwen2 one."""
    st = safetensors.load_file(str(tiny_qwen2 / "model.safetensors"))
    cfg = json.loads((tiny_qwen2 / "config.json").read_text())
    cfg.setdefault("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    assert bool((st["model.layers.0.self_attn.k_proj.bias"] != 0).all())
    out = convert(tiny_qwen2, tmp_path / "ckpt", tp=tp)
    _check_sharding(st, cfg, out, tp, architecture="Qwen2ForCausalLM")
    tcfg = json.loads((out / "config.json").read_text())
    assert tcfg["qwen_type"] == "qwen2" and tcfg["attn_bias"] is True


@pytest.mark.slow
def test_smollm2_tp1_tp3(tmp_path):
    """The real model (9 q / 3 kv heads: TP=2 is impossible by heads, TP=3 shards one kv head per rank)."""
    pytest.importorskip("transformers")
    from crisp_trt.builder import cli
    from crisp_trt.builder.artifact import load_checkpoint, save_weights

    try:
        path = cli.default_model()
    except cli.BuildError as exc:
        pytest.skip(str(exc))
    model, _ = load_checkpoint(path)
    save_weights(model, tmp_path / "hf")
    st = {("model." + k if not k.startswith(("model.", "lm_head")) else k): v
          for k, v in safetensors.load_file(str(next((tmp_path / "hf").glob("*.safetensors")))).items()}
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    cfg.setdefault("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    for tp in (1, 3):
        _check_sharding(st, cfg, convert(tmp_path / "hf", tmp_path / f"ckpt{tp}", tp=tp), tp)
    with pytest.raises(ValueError, match="tp 2: expected one of 1, 3 for this model"):
        convert(tmp_path / "hf", tmp_path / "ckpt2", tp=2)
