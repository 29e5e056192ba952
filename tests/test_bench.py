"""crisp-bench CPU smoke: op JSON schema, dense recall == 1, accuracy schema (tiny random model)."""
import json

import pytest
import torch

from crisp_trt import CrispConfig
from crisp_trt.bench import op, summary
from crisp_trt.bench.cli import main
from crisp_trt import reference
from crisp_trt.bench.recall import plan_from_masks, plan_recall, same_budget_oracle, sample_rows
from crisp_trt.lengths import parse_length
from crisp_trt.workloads.fit import fit_at
from crisp_trt.workloads.synthetic import SyntheticSpec, synthetic_qkv


def test_parse_len():
    assert parse_length("8k") == 8192 and parse_length("1M") == 1 << 20 and parse_length("131072") == 131072


def test_config_inline_json_file_and_clear_errors(tmp_path):
    """--config: an inline JSON object or a JSON file of CrispConfig fields over the default; a bad one exits with
    a message naming --config and what it expected."""
    import argparse

    from crisp_trt.bench.cli import _config

    path = tmp_path / "cfg.json"
    path.write_text('{"rows": 16, "gamma": 0.97}')
    for given in ('{"rows": 16, "gamma": 0.97}', str(path)):
        assert _config(argparse.Namespace(config=given)) == CrispConfig(rows=16, gamma=0.97)
    for given, says in (('{"gamma": 2}', "gamma"), ("{bad", "not JSON"), (str(tmp_path / "none.json"), "cannot read"),
                        ('{"bogus": 1}', "bogus")):
        with pytest.raises(SystemExit, match="--config") as e:
            _config(argparse.Namespace(config=given))
        assert says in str(e.value)


def test_op_cli_schema_and_summary(tmp_path, capsys):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(CrispConfig(block_size=64, dense_below=0, min_budget=64).to_dict()))
    step = tmp_path / "work" / "op_step"
    main(["op", "--lengths", "256", "--shapes", "smollm2", "--repeats", "1", "--out", str(step),
          "--config", str(cfg), "--device", "cpu", "--no-plots"])
    summary.main([str(tmp_path / "work"), str(tmp_path), "--tar"])  # merges the step into tmp_path, prints the table
    assert "synthetic_smollm2" in capsys.readouterr().out
    assert (tmp_path / "results.tar.gz").exists() and (tmp_path / "summary.txt").exists()
    rows = json.loads((tmp_path / "op" / "op_latest.json").read_text())["rows"]
    assert {r["method"] for r in rows} == set(op.METHODS)
    for r in rows:
        assert tuple(r) == op.ROW_KEYS
        assert r["workload"].startswith(("synthetic", "real"))
        assert 0 < r["density"] <= 1 and r["recall"] is not None and 0 <= r["recall"] <= 1 + 1e-6
    for r in rows:
        if r["method"].startswith("dense"):
            assert r["recall"] == 1.0 and r["rel_error"] == 0.0
    assert (tmp_path / "op" / "op_speedup.png").exists()


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
    methods = accuracy.METHODS + accuracy.CONTROLS
    res = accuracy.run_accuracy(lengths=(256,), depths=(0.0, 1.0), trials=2, model=model, tok=tok, methods=methods,
                                base=CrispConfig(block_size=64, dense_below=0, min_budget=64))
    path = accuracy.write_results(res, str(tmp_path))
    data = json.loads(open(path).read())
    assert {c["method"] for c in data["cells"]} == set(methods)
    dense = [c for c in data["cells"] if c["method"] == "dense"]
    assert all(c["kl"] == pytest.approx(0.0, abs=1e-6) and c["lost"] == c["gained"] == 0 for c in dense)
    eager = [c for c in data["cells"] if c["method"] == "dense_eager"]
    assert all(c["kl"] == pytest.approx(0.0, abs=1e-3) for c in eager)  # the same attention, other kernels
    for c in data["cells"]:  # paired counts: accuracy - dense accuracy = (gained - lost) / trials
        d = next(x for x in dense if x["depth"] == c["depth"])
        assert c["accuracy"] - d["accuracy"] == pytest.approx((c["gained"] - c["lost"]) / c["trials"])
    assert (tmp_path / "accuracy_crisp.png").exists()
    ppl = {p["method"]: p["perplexity"] for p in data["perplexity"]}
    assert set(ppl) == set(methods) and all(1.0 < x < float("inf") for x in ppl.values())
    assert ppl["dense_eager"] == pytest.approx(ppl["dense"], rel=1e-4)
    only = accuracy.run_accuracy(lengths=(256,), depths=(), methods=("dense", "crisp"), model=model, tok=tok,
                                 base=CrispConfig(block_size=64, dense_below=0, min_budget=64))  # --no-retrieval
    assert only["cells"] == [] and {p["method"]: p["perplexity"] for p in only["perplexity"]} == pytest.approx(
        {m: ppl[m] for m in ("dense", "crisp")}, rel=1e-6)


@pytest.mark.parametrize("argv, named", [
    (["--methods", "dense,sparse"], "--methods"),
    (["--trials", "0"], "--trials"),
    (["--depths", "0,1.5"], "--depths"),
    (["--no-retrieval", "--no-perplexity"], "--no-retrieval"),
    (["--lengths", "64"], "--lengths"),
    (["--methods", ""], "--methods"),
])
def test_accuracy_cli_rejects_bad_arguments_before_loading(argv, named, capsys):
    """Each bad value exits with status 2 and a line naming its argument (no model is loaded: --model is bogus)."""
    with pytest.raises(SystemExit) as exc:
        main(["accuracy", "--model", "/nonexistent.gguf", *argv])
    assert exc.value.code == 2 and named in capsys.readouterr().err


@pytest.mark.parametrize("kwargs, named", [
    ({"methods": ("dense", "sparse")}, "methods"),
    ({"trials": 0}, "trials"),
    ({"depths": (0.0, 1.5)}, "depths"),
    ({"lengths": (2048, 100)}, "lengths"),
])
def test_run_accuracy_rejects_bad_arguments_before_loading(kwargs, named):
    """The Python entry point checks what the CLI checks, each error naming its argument, before any model
    loads (model_path is bogus: reaching the loader would fail differently)."""
    from crisp_trt.bench import accuracy

    with pytest.raises(ValueError, match=rf"^{named}: "):
        accuracy.run_accuracy(model_path="/nonexistent.gguf", **kwargs)


def test_same_budget_oracle_against_brute_force():
    """The oracle's error is reference.attend's on masks built by hand (top blocks by window mass, the plan's
    count per query block); it keeps at least the plan's mass; a full plan scores 0 error and mass 1."""
    n, block, heads, rows = 512, 64, 4, 160
    q, k, v = (t[0] for t in synthetic_qkv(n, heads, 2, 64, spec=SyntheticSpec(), seed=3))
    _, masks = reference.plan(q, k, CrispConfig(block_size=64, dense_below=0, min_budget=64, max_budget=128,
                                                        coverage=0))
    got = same_budget_oracle(q, k, v, plan_from_masks([masks]), block, rows=rows)
    first, nb = n - rows, n // block
    dense = reference.dense_attention(q, k, v)[first:].float()
    oracle = masks.clone()
    for h in range(heads):
        kk = k[:, h // 2]
        for qb in range(first // block, nb):
            r = torch.arange(max(first, qb * block), (qb + 1) * block)
            p = torch.softmax((q[r, h] @ kk.T / 8.0).masked_fill(torch.arange(n)[None] > r[:, None], float("-inf")), -1)
            top = p.view(len(r), nb, block).sum((0, 2)).topk(int(masks[h, qb].sum())).indices
            oracle[h, qb] = torch.zeros(nb, dtype=torch.bool).index_fill_(0, top, True)
    for name, m in (("plan", masks), ("oracle", oracle)):
        out = reference.attend(q, k, v, m, block, first_row=first).float()
        assert got[f"{name}_rel_err"] == pytest.approx(float((out - dense).norm() / dense.norm()), rel=1e-3, abs=1e-6)
    assert 0 < got["plan_mass"] <= got["oracle_mass"] <= 1 + 1e-6 and got["plan_rel_err"] > 1e-3
    full = same_budget_oracle(q, k, v, plan_from_masks([torch.ones(heads, nb, nb, dtype=torch.bool).tril()]), block)
    assert full["oracle_rel_err"] < 1e-5 and full["plan_rel_err"] < 1e-5 and full["oracle_mass"] == pytest.approx(1)


def test_divergence_position_and_gap():
    """e2e's divergence: the first step where the tokens differ and dense's top-2 logit gap there."""
    import torch

    from crisp_trt.bench.e2e import divergence

    logits = [torch.tensor([0.0, 3.0, 1.0]), torch.tensor([2.5, 0.0, 2.0]), torch.tensor([0.0, 0.0, 1.0])]
    dense = ([1, 0, 2], logits)
    assert divergence(dense, [1, 0, 2]) is None
    assert divergence(dense, [1, 0]) is None  # agrees on every step both took (an earlier stop)
    assert divergence(([1, 0], logits[:2]), [1, 0, 2]) is None  # dense stopped first
    got = divergence(dense, [1, 2, 2])
    assert got["diverge_at"] == 1 and abs(got["dense_gap"] - 0.5) < 1e-6
    assert divergence(dense, [2, 0, 2]) == {"diverge_at": 0, "dense_gap": 2.0}


def test_op_workloads_are_checked_and_classes_run(tmp_path):
    """An unknown workload is refused by name; the layer-class workload runs through the op bench."""
    with pytest.raises(ValueError, match=r"workloads=\['bogus'\]"):
        op.run_op(lengths=(256,), workloads=("synthetic", "bogus"))
    base = CrispConfig(block_size=64, dense_below=0, min_budget=64)
    rows = op.run_op(lengths=(256,), methods=("dense_cudnn", "crisp"), workloads=("synthetic_classes",), repeats=1,
                     base=base)
    assert [r["workload"] for r in rows] == ["synthetic_classes_smollm2"] * 2
    assert rows[1]["method"] == "crisp" and 0 < rows[1]["density"] <= 1 and rows[1]["rel_error"] < 1e-3


def test_oracle_positions_spread_whole_blocks():
    """spread: rows // block whole query blocks at the midpoints of equal slices (every block when fewer
    exist; the last, partial block clipped to n); last: the last rows; anything else is refused."""
    from crisp_trt.bench.recall import oracle_positions

    got = oracle_positions(1000, 64, 256, "spread")  # 16 blocks, 4 chosen: 2, 6, 10, 14
    assert got.tolist() == [t for b in (2, 6, 10, 14) for t in range(64 * b, 64 * b + 64)]
    assert oracle_positions(1000, 64, 4096, "spread").tolist() == list(range(1000))
    assert oracle_positions(1000, 64, 10, "spread").tolist() == list(range(512, 576))  # at least one block
    assert oracle_positions(1000, 64, 100, "last").tolist() == list(range(900, 1000))
    with pytest.raises(ValueError, match="where='first'"):
        oracle_positions(1000, 64, 100, "first")


@pytest.mark.parametrize("argv,folder", [(["op"], "op"), (["frontier"], "frontier"), (["accuracy"], "accuracy"),
                                         (["sweep", "an_artifact"], "e2e")])
def test_default_out_is_the_benchmarks_latest_folder(monkeypatch, argv, folder):
    """Without --out each subcommand writes to its own folder of bench/results/latest/ (what docs/results.md reads)."""
    from crisp_trt.bench import cli

    seen = {}
    for name in ("cmd_op", "cmd_frontier", "cmd_accuracy", "cmd_sweep"):
        monkeypatch.setattr(cli, name, lambda args: seen.update(out=args.out))
    cli.main(argv)
    assert seen["out"] == f"bench/results/latest/{folder}"


def test_calibration_recall_is_the_bench_recall():
    """crisp-build's calibration scores a plan with crisp-bench's recall: same rows, same mass, same number."""
    from crisp_trt.builder.calibrate import block_mass

    q, k, _ = (t[0] for t in synthetic_qkv(640, 4, 2, 64, spec=SyntheticSpec(), seed=5))
    _, masks = reference.plan(q, k, CrispConfig(block_size=64, dense_below=0, min_budget=64, max_budget=128))
    rows, mass = block_mass(q, k, 64)
    per_head = (mass * masks[:, rows // 64]).sum(-1).mean(-1)
    bench = plan_recall(q, k, plan_from_masks([masks]), 64)
    assert float(per_head.mean()) == pytest.approx(bench, rel=1e-6) and bench < 1.0
