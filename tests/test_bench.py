"""crisp-bench CPU smoke: op JSON schema, dense recall == 1, accuracy schema (tiny random model)."""
import json

import pytest
import torch

from crisp_trt import CrispConfig
from crisp_trt.bench import op, summary
from crisp_trt.bench.cli import main
from crisp_trt.bench.recall import plan_from_masks, plan_recall, sample_rows
from crisp_trt.builder.cli import parse_length
from crisp_trt.workloads.fit import fit_at
from crisp_trt.workloads.synthetic import SyntheticSpec, synthetic_qkv


def test_parse_len():
    assert parse_length("8k") == 8192 and parse_length("1M") == 1 << 20 and parse_length("131072") == 131072


def test_op_cli_schema_and_summary(tmp_path, capsys):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(CrispConfig(block_size=64, dense_below=0, min_budget=64).to_dict()))
    step = tmp_path / "work" / "op_step"
    main(["op", "--lengths", "256", "--shapes", "smollm2", "--repeats", "1", "--out", str(step),
          "--config", str(cfg), "--device", "cpu", "--no-plots"])
    summary.main([str(tmp_path / "work"), str(tmp_path)])  # merges the step into tmp_path, prints the table
    assert "synthetic_smollm2" in capsys.readouterr().out
    assert (tmp_path / "results.tar.gz").exists() and (tmp_path / "summary.txt").exists()
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


def test_dense_plan_recall_is_one():
    q, k, _ = synthetic_qkv(256, 4, 2, 64, seed=1)
    full = plan_from_masks([torch.ones(4, 4, 4, dtype=torch.bool).tril()])
    assert plan_recall(q[0], k[0], full, 64) == pytest.approx(1.0, abs=1e-6)
    diag_only = plan_from_masks([torch.eye(4, dtype=torch.bool).expand(4, 4, 4)])
    diag_only.dense[0] = 1  # dense flag: every causal block, whatever the lists say
    assert plan_recall(q[0], k[0], diag_only, 64) == pytest.approx(1.0, abs=1e-6)


def test_plan_recall_matches_hand_computed_mass():
    """A known mask (diagonal + sink block for head 0, diagonal only elsewhere) against the mass summed by hand."""
    n, block, heads = 256, 64, 4
    q, k, _ = synthetic_qkv(n, heads, 2, 64, seed=2)
    masks = torch.eye(4, dtype=torch.bool).repeat(heads, 1, 1)
    masks[0, :, 0] = True
    got = plan_recall(q[0], k[0], plan_from_masks([masks]), block)
    rows = sample_rows(n)
    want = 0.0
    for h in range(heads):
        logits = q[0, rows, h] @ k[0, :, h // 2].T / 8.0
        p = torch.softmax(logits.masked_fill(torch.arange(n)[None] > rows[:, None], float("-inf")), -1)
        for i, r in enumerate(rows.tolist()):
            qb = r // block
            kept = p[i, qb * block:(qb + 1) * block].sum() + (p[i, :block].sum() if h == 0 and qb > 0 else 0)
            want += float(kept) / len(rows) / heads
    assert got == pytest.approx(want, abs=1e-6) and got < 0.999


def test_fit_at_matches_target_shares():
    target = {"sink_share": 0.3, "local_share": 0.3, "top_share": 0.15, "floor": 0.3}
    spec, got = fit_at(target, n=512, iters=6)
    assert isinstance(spec, SyntheticSpec) and spec.ref_n == 512
    assert all(abs(got[s] - target[s]) < 0.03 for s in ("sink_share", "local_share", "top_share"))
    assert abs(got["background_share"] - 0.25) < 0.05


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
