"""crisp-bench frontier: sweep grammar, the dedupe of caps that cannot bind, the equal-error comparison,
and a CPU run whose default-config point equals the op bench's crisp row on the same input."""
import json
import math

import pytest

from crisp_trt import CrispConfig
from crisp_trt.bench import frontier, op
from crisp_trt.bench.cli import main


def test_parse_sweep_grid_lengths_and_errors():
    grid = frontier.parse_sweep("gamma=0.9,0.99; max_budget=16k,1M")
    assert grid == [{"gamma": 0.9, "max_budget": 16384}, {"gamma": 0.9, "max_budget": 1 << 20},
                    {"gamma": 0.99, "max_budget": 16384}, {"gamma": 0.99, "max_budget": 1 << 20}]
    assert all(isinstance(g["max_budget"], int) and isinstance(g["gamma"], float) for g in grid)
    with pytest.raises(ValueError, match="sweep knob 'budgetx'"):
        frontier.parse_sweep("budgetx=1,2")
    with pytest.raises(ValueError, match=r"expected knob=v1,v2"):
        frontier.parse_sweep("max_budget")
    with pytest.raises(ValueError, match="expected at least one"):
        frontier.parse_sweep(" ; ")
    with pytest.raises(ValueError, match=r"sweep knob max_budget='lots': expected 0 or a length like 16k"):
        frontier.parse_sweep("max_budget=lots")
    with pytest.raises(ValueError, match=r"sweep knob gamma='high': expected a number"):
        frontier.parse_sweep("gamma=high")
    assert frontier.parse_sweep("budget=floor,cumulative") == [{"budget": "floor"}, {"budget": "cumulative"}]
    assert frontier.parse_sweep("dense_below=0,8k") == [{"dense_below": 0}, {"dense_below": 8192}]
    with pytest.raises(ValueError, match="sweep knob 'max_budget': expected at least one value"):
        frontier.parse_sweep("max_budget=,")
    with pytest.raises(ValueError, match="sweep knob 'gamma' given twice"):
        frontier.parse_sweep("gamma=0.9;gamma=0.95")
    assert frontier.knob_label({"budget": "floor", "max_budget": 1 << 20, "gamma": 0.9}) == \
        "budget=floor max_budget=1M gamma=0.9"


def test_caps_past_n_are_measured_once():
    grid = frontier.parse_sweep("max_budget=1k,4k,8k,1M")
    kept = frontier.sweep_configs("crisp", grid, 4096)
    assert [knobs["max_budget"] for knobs, _ in kept] == [1024, 4096]
    assert all(cfg.routing == "struct" for _, cfg in kept)
    short = frontier.sweep_configs("crisp", grid, 100, CrispConfig(min_budget=0))  # n < one block of 128
    assert [knobs["max_budget"] for knobs, _ in short] == [1024]
    with pytest.raises(ValueError, match=r"CrispConfig.budget='topk'"):
        frontier.sweep_plan((4096,), {"crisp": "budget=topk"})
    fp = frontier.sweep_configs("flexprefill", frontier.parse_sweep("gamma=0.9,0.95"), 4096)
    assert [cfg.gamma for _, cfg in fp] == [0.9, 0.95] and all(cfg.routing == "jsd" for _, cfg in fp)


def _pt(method, err, speed, n=1024, **knobs):
    return {"n": n, "method": method, "knobs": knobs, "rel_error": err, "speedup_vs_cudnn": speed, "density": 0.5}


def test_compare_and_best_within():
    pts = [_pt("crisp", 0.01, 2.0, b=1), _pt("crisp", 0.05, 4.0, b=2),
           _pt("flexprefill", 0.06, 3.0, g=1), _pt("flexprefill", 0.02, 2.5, g=2),
           _pt("crisp", 0.01, 1.0, n=2048), _pt("flexprefill", 0.005, 1.5, n=2048)]
    c1, c2 = frontier.compare(pts)
    # 1k: at flexprefill's 2 % CRISP's best is 2.0× (< 2.5×); at its 6 % CRISP has 4.0× → not dominated
    assert [(c["other_error"], c["best_speedup"], c["faster"]) for c in c1["points"]] == \
        [(0.02, 2.0, False), (0.06, 4.0, True)]
    assert c1["dominates"] is False
    # 2k: CRISP never reaches flexprefill's 0.5 %, so there is no CRISP point to compare
    assert c2["points"][0]["best_speedup"] is None and c2["dominates"] is False
    assert frontier.compare([p for p in pts if p["method"] == "crisp"])[0]["dominates"] is None  # nothing to beat
    assert frontier.compare([p for p in pts if p["knobs"] != {"g": 2} and p["n"] == 1024])[0]["dominates"] is True
    # at equal error on CRISP's front (1 %, 2.0×) – (5 %, 4.0×), log-log: 2 · 2^(ln 2 / ln 5) ≈ 2.70× at 2 %
    assert c1["points"][0]["speedup_at_equal_error"] == pytest.approx(2 * 2 ** (math.log(2) / math.log(5)))
    assert c1["points"][1]["speedup_at_equal_error"] is None  # 6 % lies past CRISP's measured range
    best = {(b["n"], b["method"]): b for b in frontier.best_within(pts, 0.02)}
    assert best[(1024, "crisp")]["speedup_vs_cudnn"] == 2.0 and best[(1024, "flexprefill")]["knobs"] == {"g": 2}
    assert best[(2048, "flexprefill")]["speedup_vs_cudnn"] == 1.5


def test_pareto_drops_beaten_points():
    pts = [_pt("crisp", 0.01, 1.0), _pt("crisp", 0.02, 0.9), _pt("crisp", 0.03, 3.0), _pt("crisp", 0.03, 2.0)]
    assert [(p["rel_error"], p["speedup_vs_cudnn"]) for p in frontier.pareto(pts)] == [(0.01, 1.0), (0.03, 3.0)]
    front = frontier.pareto(pts)
    assert frontier.speedup_at(front, 0.01) == 1.0 and frontier.speedup_at(front, 0.03) == pytest.approx(3.0)
    assert frontier.speedup_at(front, 0.005) is None and frontier.speedup_at(front, 0.05) is None


def test_frontier_cli_cpu_matches_op_bench(tmp_path, capsys):
    """Tiny CPU run: schema, finite errors, and the point with the default cap equals the op bench's crisp
    row on the same input (both seed the workload by n)."""
    base = CrispConfig(block_size=64, dense_below=0, min_budget=64)
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(base.to_dict()))
    main(["frontier", "--lengths", "512", "--shape", "smollm2", "--workload", "synthetic_classes", "--crisp",
          "max_budget=64,16k", "--flexprefill", "gamma=0.9,0.99;max_budget=1M", "--repeats", "1", "--device", "cpu",
          "--config", str(cfg), "--out", str(tmp_path)])
    res = json.loads((tmp_path / "frontier_latest.json").read_text())
    pts = res["points"]
    assert [(p["method"], p["knobs"]) for p in pts] == [
        ("crisp", {"max_budget": 64}), ("crisp", {"max_budget": 16384}),
        ("flexprefill", {"gamma": 0.9, "max_budget": 1 << 20}), ("flexprefill", {"gamma": 0.99, "max_budget": 1 << 20})]
    for p in pts:
        assert tuple(p) == frontier.POINT_KEYS
        assert 0 < p["density"] <= 1 and 0 <= p["rel_error"] < 1 and 0 <= p["recall"] <= 1 + 1e-6
    assert pts[0]["density"] < pts[1]["density"]  # a one-block cap keeps fewer blocks than no cap
    for p in pts:  # 8 blocks of 64: the spread sample is every row, so the plan's replay is the op's error
        assert p["sampled_error"] == pytest.approx(p["rel_error"], abs=1e-5)
    assert pts[0]["oracle_error"] < pts[0]["sampled_error"]  # the best blocks at the same counts do better
    row = op.run_op(lengths=(512,), methods=("crisp",), workloads=("synthetic_classes",), repeats=1, base=base)[0]
    assert pts[1]["density"] == pytest.approx(row["density"]) and pts[1]["rel_error"] == pytest.approx(row["rel_error"])
    assert len(res["compare"]) == 1 and (tmp_path / "frontier.png").exists()
    assert "crisp at least as fast" in capsys.readouterr().out


def test_cli_names_a_bad_argument(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["frontier", "--lengths", "512", "--workload", "bogus", "--device", "cpu"])
    assert stop.value.code == 2
    assert "crisp-bench frontier: error: workload='bogus': expected one of" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["frontier", "--lengths", "512", "--crisp", "kappa=big", "--device", "cpu"])
    assert "sweep knob kappa='big': expected a number" in capsys.readouterr().err


def test_an_empty_grid_leaves_its_method_out():
    base = CrispConfig(block_size=64, dense_below=0, min_budget=0)
    pts = frontier.run_frontier(lengths=(256,), sweeps={"crisp": "max_budget=64", "flexprefill": " "}, repeats=1,
                                base=base)
    assert [(p["method"], p["knobs"]) for p in pts] == [("crisp", {"max_budget": 64})]
