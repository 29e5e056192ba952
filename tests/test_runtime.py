"""The artifact format version: crisp_trt.runtime reads only runtime.FORMAT and says how to rebuild otherwise
(builder/artifact.py writes it: tests/test_tp.py checks a built artifact)."""
import json

import pytest

from crisp_trt import runtime


def _artifact(tmp_path, **crisp):
    """A config.json with a "crisp" section and nothing else (the check runs before any weight is read)."""
    cfg = {"architectures": ["LlamaForCausalLM"], "num_attention_heads": 4, "num_key_value_heads": 2,
           "crisp": {"config": {}, "layers": [], **crisp}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


@pytest.mark.parametrize("crisp, found", [({}, "has no format version"), ({"format": 99}, "has format 99"),
                                          ({"format": "1"}, "has format '1'")])
def test_unknown_format_is_refused_with_the_rebuild_command(tmp_path, crisp, found):
    art = _artifact(tmp_path, **crisp)
    expected = rf"{found}; this crisp-run reads format {runtime.FORMAT}\. Rebuild .*crisp-build --model CHECKPOINT --output {art}"
    with pytest.raises(ValueError, match=expected):
        runtime.read_crisp(art)
    with pytest.raises(ValueError, match=expected):
        runtime.load(art)


def test_crisp_run_reports_the_format(tmp_path, capsys):
    art = _artifact(tmp_path)
    assert runtime.main([str(art), "--prompt", "hi", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("crisp-run: error:") and "has no format version" in err and "crisp-build" in err


def test_current_format_is_read(tmp_path):
    art = _artifact(tmp_path, format=runtime.FORMAT, tp=1)
    assert runtime.read_crisp(art)["format"] == runtime.FORMAT

