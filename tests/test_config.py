"""CrispConfig: defaults, validation naming the field, exact dict round trip."""
import pytest

from crisp_trt import CrispConfig, method_config


def test_round_trip_and_derived():
    cfg = CrispConfig(block_size=64, sink_tokens=70, min_budget=100)
    assert CrispConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.window == 64 and cfg.sink_blocks == 2 and cfg.min_blocks == 2


@pytest.mark.parametrize("field, value, error", [
    ("block_size", 96, ValueError), ("block_size", 128.0, TypeError), ("last_q", 48, ValueError),
    ("last_q", 256, ValueError), ("local_blocks", 0, ValueError), ("kappa", -1.0, ValueError),
    ("kappa", float("nan"), TypeError), ("tau", "0.5", TypeError), ("routing", "kl", ValueError),
    ("budget", "topk", ValueError), ("gamma", 0.0, ValueError), ("max_budget", 64, ValueError),
    ("min_budget", -1, ValueError), ("dense_below", -5, ValueError), ("floor_quantile", 1.5, ValueError),
    ("floor_samples", 50, ValueError), ("sink_tokens", True, TypeError), ("tau", -0.1, ValueError),
    ("tau", 1 + 2 ** -25, ValueError),  # float32 rounds it to 1: the kernels would run the estimate, the op not
])
def test_invalid_field_named(field, value, error):
    with pytest.raises(error, match=field):
        CrispConfig(**{field: value})


def test_unknown_field_in_dict():
    with pytest.raises(ValueError, match="bogus"):
        CrispConfig.from_dict({"bogus": 1})


def test_methods():
    fp = method_config("flexprefill")
    assert (fp.routing, fp.budget, fp.gamma, fp.tau, fp.min_budget, fp.block_size) == ("jsd", "cumulative", 0.9, 0.1, 1024, 128)
    assert fp.spike == 0.0 and CrispConfig().spike > 0  # the baseline has no spike stage, whatever CRISP's default
    assert method_config("crisp_gamma").budget == "cumulative" and method_config("crisp_jsd").routing == "jsd"
    with pytest.raises(ValueError, match="method"):
        method_config("magic")
    sr = CrispConfig.sampled_rows(gamma=0.97, max_budget=131072)
    assert (sr.rows, sr.tau, sr.budget, sr.gamma, sr.min_budget, sr.spike, sr.max_budget) == (
        16, 1.5, "cumulative", 0.97, 0, 0.0, 131072)
    with pytest.raises(ValueError, match="rows"):
        CrispConfig.sampled_rows(rows=12)
