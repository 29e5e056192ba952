"""crisp-bench CPU smoke: op JSON schema, dense recall == 1, accuracy schema (tiny random model)."""
import json

import pytest
import torch

from crisp_trt import CrispConfig
from crisp_trt.bench import op
from crisp_trt.bench.cli import main, parse_len
from crisp_trt.workloads.fit import attention_stats, fit_spec
from crisp_trt.workloads.synthetic import SyntheticSpec, synthetic_qkv


def test_parse_len():
    assert parse_len("8k") == 8192 and parse_len("1M") == 1 << 20 and parse_len("131072") == 131072


def test_op_cli_schema(tmp_path):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(CrispConfig(block_size=64, dense_below=0, min_budget=64).to_dict()))
    main(["op", "--lengths", "256", "--shapes", "smollm2", "--repeats", "1", "--out", str(tmp_path),
          "--config", str(cfg), "--device", "cpu"])
    rows = json.loads((tmp_path / "op_latest.json").read_text())["rows"]
    assert {r["method"] for r in rows} == set(op.METHODS)
    for r in rows:
        assert tuple(r) == op.ROW_KEYS
        assert r["workload"].startswith(("synthetic", "real"))
        assert 0 < r["density"] <= 1 and r["recall"] is not None and 0 <= r["recall"] <= 1 + 1e-6
    for r in rows:
        if r["method"].startswith("dense"):
            assert r["recall"] == 1.0 and r["rel_error"] == 0.0
    assert (tmp_path / "op_speedup.png").exists()


def test_dense_mask_recall_is_one():
    q, k, _ = synthetic_qkv(256, 4, 2, 64, seed=1)
    masks = torch.ones(4, 4, 4, dtype=torch.bool).tril()
    assert op.mass_recall(q[0], k[0], masks, 64) == pytest.approx(1.0, abs=1e-5)


def test_fit_moves_toward_target():
    target = {"sink_share": 0.5, "local_share": 0.3, "top_share": 0.1, "floor": 0.5}
    spec, got = fit_spec(target, n=256, iters=5, rounds=1)
    assert isinstance(spec, SyntheticSpec)
    assert abs(got["sink_share"] - 0.5) < abs(attention_stats(*synthetic_qkv(256, 4, 2, 64)[:2])["sink_share"] - 0.5) + 0.05


def test_accuracy_tiny(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models, pre_tokenizers

    from crisp_trt.bench import accuracy

    vocab = {w: i for i, w in enumerate(["[UNK]"] + [chr(c) for c in range(32, 127)])}
    t = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok = PreTrainedTokenizerFast(tokenizer_object=t)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).eval()
    res = accuracy.run_accuracy(lengths=(256,), depths=(0.0, 1.0), trials=2, model=model, tok=tok,
                                base=CrispConfig(block_size=64, dense_below=0, min_budget=64))
    path = accuracy.write_results(res, str(tmp_path))
    data = json.loads(open(path).read())
    assert {c["method"] for c in data["cells"]} == set(accuracy.METHODS)
    dense = [c for c in data["cells"] if c["method"] == "dense"]
    assert all(c["kl"] == pytest.approx(0.0, abs=1e-6) for c in dense)
    assert (tmp_path / "accuracy_crisp.png").exists()
