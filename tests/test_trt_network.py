"""CrispPrefillAttention under a real TensorRT builder (TensorRT-RTX 1.7 or TensorRT): the plugin in a network
with packed varlen inputs and a profile up to 128k tokens, built and serialised, the builder's asks against the
plugin's answers (scripts/device/gpu_trt_rtx.py); and the exported prefill graph parsed with a plugin layer per
attention layer. Runs where a builder (with full TensorRT: and a CUDA GPU; TensorRT-RTX builds on the CPU) and
the built plugin library are present; skips otherwise, saying which is missing. Each build runs in a child
process (a library abort is reported as a failure)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from crisp_trt import plugin

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def toolchain():
    try:
        trt = plugin.tensorrt(builder=True)
    except ImportError as exc:
        pytest.skip(f"no TensorRT builder: {exc}")
    if not plugin.is_rtx(trt) and not torch.cuda.is_available():  # TensorRT-RTX builds on the CPU too
        pytest.skip("needs a CUDA GPU (TensorRT builds for the device it runs on)")
    try:
        library = plugin.library_path()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    return trt, library


def test_plugin_in_network_builds_to_128k(toolchain, tmp_path):
    out = tmp_path / "network.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "device" / "gpu_trt_rtx.py"), "--json", str(out)],
                          capture_output=True, text=True, timeout=900)
    rows = json.loads(out.read_text())["rows"]
    for row in rows:
        assert row["ok"], row
        assert row["shape_ok"] and row["dtype_ok"] and row["plugin_layers"] == 1, row  # [q.d0, H, d], q's type
        assert row["build_at_workspace"] and not row["build_below_workspace"], row  # it asked for exactly that
    assert proc.returncode == 0, proc.stdout[-2000:]


_PARSE = """
import sys, torch
from transformers import AutoModelForCausalLM, Qwen2Config
from crisp_trt import CrispConfig, plugin
from crisp_trt.builder import engine, onnx_export
cfg = Qwen2Config(vocab_size=320, hidden_size=256, intermediate_size=512, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64)
model = AutoModelForCausalLM.from_config(cfg).eval().to(torch.bfloat16)
path = onnx_export.export(model, sys.argv[1], CrispConfig())
record = engine.build_plan(path, sys.argv[2], max_tokens=8192, max_batch=2)
print("RECORD", record["plugin_layers"], record["layers"], record["plan_bytes"])
"""


def test_exported_graph_parses_and_builds(toolchain, tmp_path):
    """A tiny Qwen2 graph (3 layers, biases, bf16) through the ONNX parser: 3 plugin layers, a plan."""
    proc = subprocess.run([sys.executable, "-c", _PARSE, str(tmp_path / "m.onnx"), str(tmp_path / "m.plan")],
                          capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RECORD")]
    assert lines, f"rc {proc.returncode}: {proc.stderr[-1500:]}"
    plugins, layers, size = map(int, lines[0].split()[1:])
    assert plugins == 3 and layers > 3 and size > 0
