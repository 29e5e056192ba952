"""The TensorRT plugin (plugin/, crisp_trt/plugin.py).

Python-side field tests always run. The native tests build libcrisp_trt_plugin.so with
scripts/build_plugin.sh where TensorRT headers exist ($TensorRT_ROOT or third_party/TensorRT) and drive it
through the lean runtime's plugin registry (tensorrt-lean-cu13-libs) with plugin/tests/crispPluginCheck.cpp:
creator lookup, creation, clone, serialisation round trips, malformed collections, a fuzz, and the same
under AddressSanitizer/UBSan with leak detection. No GPU needed. The AOT tests compile a kernel variant
(scripts/aot_kernels.py) and its generated C++ table on the CPU. The GPU tests drive enqueue on CUDA buffers
(plugin/tests/crispPluginHarness.cpp via scripts/aot_harness.py) and compare with crisp_prefill_attention.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from crisp_trt import CrispConfig, method_config
from crisp_trt import plugin

ROOT = Path(__file__).resolve().parent.parent
FUZZ_COLLECTIONS = 10_000
sys.path.insert(0, str(ROOT / "scripts"))


def _headers() -> Path | None:
    root = Path(os.environ.get("TensorRT_ROOT") or ROOT / "third_party" / "TensorRT")
    return root if (root / "include" / "NvInferRuntime.h").is_file() else None


@pytest.fixture(scope="session")
def lean_runtime() -> Path:
    spec = importlib.util.find_spec("tensorrt_lean_libs")
    if spec is None or spec.origin is None:
        pytest.skip(f"the TensorRT lean runtime is not installed ({plugin.INSTALL_HINT})")
    path = Path(spec.origin).parent / "libnvinfer_lean.so.11"
    if not path.is_file():
        pytest.skip(f"{path} missing: tensorrt-lean-cu13-libs has another layout")
    return path


def _build(name: str, *cmake_args: str) -> Path:
    headers = _headers()
    if headers is None:
        pytest.skip("TensorRT headers not found (set TensorRT_ROOT, or put NVIDIA/TensorRT's include/ under "
                    "third_party/TensorRT): the plugin is not built")
    if shutil.which("cmake") is None or shutil.which("nvcc") is None:
        pytest.skip("cmake and nvcc are needed to build the plugin")
    build = ROOT / "build" / name
    run = subprocess.run([str(ROOT / "scripts" / "build_plugin.sh"), str(headers), *cmake_args],
                         env=dict(os.environ, BUILD_DIR=str(build)), capture_output=True, text=True)
    assert run.returncode == 0, f"plugin build failed (-Wall -Wextra -Werror):\n{run.stdout}\n{run.stderr}"
    return build


@pytest.fixture(scope="session")
def built() -> Path:
    return _build("plugin", "-DCRISP_TRT_CUDA_ARCHITECTURES=90")


@pytest.fixture(scope="session")
def built_asan() -> Path:
    return _build("plugin-asan", "-DCRISP_TRT_SANITIZE=ON", "-DCRISP_TRT_CUDA_ARCHITECTURES=none")


def _check(build: Path, runtime: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    command = [str(build / "crisp_plugin_check"), str(runtime), str(build / plugin.LIBRARY), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)


def _serialised(fields) -> str:
    return "".join(f"{name} {kind} {value.tobytes().hex()}\n" for name, value, kind in fields)


# --- Python side (always) ------------------------------------------------------------------------------

def test_fields_cover_config_and_heads():
    fields = plugin.plugin_fields(CrispConfig(), 32, 8, 128)
    names = [name for name, _, _ in fields]
    assert names == list(CrispConfig().to_dict()) + ["num_heads", "num_kv_heads", "head_dim"]
    kinds = {name: kind for name, _, kind in fields}
    assert kinds["kappa"] == "FLOAT32" and kinds["routing"] == "CHAR" and kinds["block_size"] == "INT32"
    values = {name: value for name, value, _ in fields}
    assert values["routing"].tobytes() == b"struct" and values["gamma"].dtype == np.float32
    assert all(v.size == 1 for _, v, k in fields if k != "CHAR")


@pytest.mark.parametrize("heads", [(0, 1, 64), (32, 7, 128), (8, 16, 64), (9, 3, 96), (True, 1, 64)])
def test_fields_reject_bad_heads(heads):
    with pytest.raises((ValueError, TypeError), match="num_heads|num_kv_heads|head_dim"):
        plugin.plugin_fields(CrispConfig(), *heads)


def test_library_path_names_how_to_build(monkeypatch, tmp_path):
    monkeypatch.setenv(plugin.ENV_LIBRARY, str(tmp_path / "missing.so"))
    with pytest.raises(FileNotFoundError, match="build_plugin.sh"):
        plugin.library_path()


def test_missing_tensorrt_names_the_packages():
    try:
        plugin.tensorrt()
    except ImportError as e:
        assert plugin.INSTALL_HINT in str(e)
    else:
        pytest.skip("the TensorRT Python bindings are importable here")


def test_field_collection_with_tensorrt_bindings():
    try:
        trt = plugin.tensorrt()
    except ImportError as e:
        pytest.skip(f"TensorRT Python bindings not importable: {e}")
    fc = plugin.field_collection(CrispConfig(), 32, 8, 128, trt=trt)
    assert len(fc) == 17


class _FakeRegistry:
    def __init__(self, handle, creator):
        self.handle, self.creator, self.calls = handle, creator, []

    def load_library(self, path):
        self.calls.append(("load_library", path))
        return self.handle

    def get_creator(self, *key):
        self.calls.append(("get_creator", key))
        return self.creator


def test_load_uses_the_registry_and_names_failures(tmp_path):
    library = tmp_path / plugin.LIBRARY
    registry = _FakeRegistry(handle=1, creator="creator")
    assert plugin.load(registry, library) == "creator"
    assert registry.calls == [("load_library", str(library)), ("get_creator", ("CrispPrefillAttention", "1", "crisp"))]
    with pytest.raises(RuntimeError, match="could not load"):
        plugin.load(_FakeRegistry(handle=None, creator="creator"), library)
    with pytest.raises(RuntimeError, match="no creator crisp::CrispPrefillAttention v1"):
        plugin.load(_FakeRegistry(handle=1, creator=None), library)


def test_field_collection_maps_types():
    fake = SimpleNamespace(PluginFieldType=SimpleNamespace(INT32="i", FLOAT32="f", CHAR="c"),
                           PluginField=lambda name, value, kind: (name, value, kind), PluginFieldCollection=list)
    fc = plugin.field_collection(CrispConfig(), 9, 3, 64, trt=fake)
    assert [(n, k) for n, _, k in fc][:5] == [("block_size", "i"), ("last_q", "i"), ("sink_tokens", "i"),
                                              ("local_blocks", "i"), ("kappa", "f")]
    assert dict((n, k) for n, _, k in fc)["routing"] == "c" and len(fc) == 17


# --- native: the library through the lean runtime's registry ---------------------------------------------

def test_library_exports_creators_without_libnvinfer(built):
    library = built / plugin.LIBRARY
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True).stdout
    assert " T getCreators" in symbols and " T setLoggerFinder" in symbols
    assert "libnvinfer" not in subprocess.run(["ldd", str(library)], capture_output=True, text=True).stdout


def test_schema_matches_python(built, lean_runtime):
    run = _check(built, lean_runtime, "fields")
    assert run.returncode == 0, run.stdout + run.stderr
    schema = [line.split() for line in run.stdout.splitlines() if not line.startswith("ok ")]
    assert schema == [[name, kind] for name, _, kind in plugin.plugin_fields(CrispConfig(), 32, 8, 128)]


def test_create_clone_roundtrip_build_queries_malformed(built, lean_runtime):
    run = _check(built, lean_runtime, "check")
    assert run.returncode == 0 and "ok 0 failures" in run.stdout, run.stdout + run.stderr
    assert "ok malformed 166/166 rejected" in run.stdout  # each with one error through the logger
    assert 'ok logged: CrispPrefillAttention: createPlugin: missing field "block_size"' in run.stdout


CONFIGS = [
    (CrispConfig(), (32, 8, 128)),
    (method_config("flexprefill"), (32, 8, 128)),
    (method_config("crisp_jsd"), (9, 3, 64)),
    (CrispConfig(block_size=64, last_q=32, kappa=0.1, floor_quantile=0.25, tau=0.0, min_budget=0,
                 max_budget=64, dense_below=0, floor_samples=16, gamma=1.0), (1, 1, 256)),
]


@pytest.mark.parametrize("config,heads", CONFIGS)
def test_python_fields_roundtrip_exactly(built, lean_runtime, tmp_path, config, heads):
    text = _serialised(plugin.plugin_fields(config, *heads))
    (tmp_path / "fields").write_text(text)
    run = _check(built, lean_runtime, "roundtrip", str(tmp_path / "fields"))
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.split("\n", 1)[1] == text


def test_python_fields_out_of_range_rejected(built, lean_runtime, tmp_path):
    fields = plugin.plugin_fields(CrispConfig(), 32, 8, 128)
    fields = [(n, np.array([96], np.int32) if n == "block_size" else v, k) for n, v, k in fields]
    (tmp_path / "fields").write_text(_serialised(fields))
    run = _check(built, lean_runtime, "roundtrip", str(tmp_path / "fields"))
    assert run.returncode == 2 and "REJECTED" in run.stdout


@pytest.mark.parametrize("seed", [1, 2])
def test_fuzz_field_collections(built, lean_runtime, seed):
    run = _check(built, lean_runtime, "fuzz", str(FUZZ_COLLECTIONS), str(seed))
    assert run.returncode == 0 and " 0 failures" in run.stdout, run.stdout + run.stderr
    created = int(run.stdout.split(" created")[0].rsplit(" ", 1)[1])
    assert 0 < created < FUZZ_COLLECTIONS  # both valid and malformed collections were exercised


@pytest.mark.parametrize("args", [("check",), ("fuzz", str(FUZZ_COLLECTIONS), "3")])
def test_sanitizers_clean(built_asan, lean_runtime, args):
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0", UBSAN_OPTIONS="halt_on_error=1")
    run = _check(built_asan, lean_runtime, *args, env=env)
    report = run.stdout + run.stderr
    assert run.returncode == 0 and "Sanitizer" not in report and " 0 failures" in report, report


# --- AOT: the kernels compiled ahead of time (CPU) ---------------------------------------------------------

@pytest.fixture(scope="session")
def aot_image(tmp_path_factory):
    """One attend variant compiled for sm_90, in a process without TRITON_INTERPRET (conftest sets it on CPU,
    and the interpreter's kernels cannot be compiled)."""
    import pickle
    path = tmp_path_factory.mktemp("aot") / "image.pickle"
    code = ("import pickle, sys, aot_kernels as a; v = next(a.variants(a.KERNELS['attend'], [(9, 3)], 8192)); "
            "pickle.dump(a.compile_image('attend', v, 90), open(sys.argv[1], 'wb'))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "scripts"), str(ROOT)])
    run = subprocess.run([sys.executable, "-c", code, str(path)], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return pickle.loads(path.read_bytes())


def test_aot_image_matches_the_launch_contract(aot_image):
    assert aot_image.cubin[:4] == b"\x7fELF" and aot_image.kernel == "attend_kernel" and aot_image.shared > 0
    names = [name for name, _ in aot_image.params]
    assert names[-2:] == ["global_scratch", "profile_scratch"] and names[0] == "q_ptr"
    assert aot_image.constexprs["NQB"] == 8192 // aot_image.constexprs["BLOCK"]
    assert aot_image.constexprs["MAXK"] == 1 and aot_image.constexprs["INTERPRET"] == 0


@pytest.mark.parametrize("block,d", [(64, 64), (64, 256), (128, 128), (128, 64)])
def test_aot_options_match_the_torch_launcher(aot_image, monkeypatch, block, d):
    """The cubins are built with the num_warps/num_stages and constexpr names attend.attend launches with."""
    import aot_kernels
    import torch
    from crisp_trt.kernels import attend as attend_module
    spec = aot_kernels.KERNELS["attend"]
    seen = {}

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: seen.update(kwargs)

    monkeypatch.setattr(attend_module, "attend_kernel", Recorder())
    q = torch.zeros(block, 2, d, dtype=torch.float16)
    idx, counts = torch.zeros(1, 2, 1, 1, dtype=torch.int32), torch.zeros(1, 2, 1, dtype=torch.int32)
    attend_module.attend(q, q[:, :1], q[:, :1], torch.tensor([0, block], dtype=torch.int32), idx, counts,
                         torch.ones(1, dtype=torch.int32), block)
    variant = {"BLOCK": block, "D": d}
    assert {k: seen[k] for k in ("num_warps", "num_stages")} == spec.options(variant)
    assert set(aot_image.constexprs) == set(seen) - {"num_warps", "num_stages"}


def test_aot_generated_table_compiles(aot_image, tmp_path):
    import aot_compile
    cubin = tmp_path / "attend.cubin"
    cubin.write_bytes(aot_image.cubin)
    for name, images in (("one.cpp", [aot_image]), ("empty.cpp", [])):
        (tmp_path / name).write_text(aot_compile.render(images, [cubin.resolve()], 8192))
        run = subprocess.run(["g++", "-std=c++17", "-Wall", "-Wextra", "-Werror", "-c", "-I", str(ROOT / "plugin"),
                              str(tmp_path / name), "-o", str(tmp_path / (name + ".o"))], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
    symbols = subprocess.run(["nm", str(tmp_path / "one.cpp.o")], capture_output=True, text=True).stdout
    assert "crispKernelImages" in symbols and "crispKernelMaxSeqLen" in symbols


# --- GPU: enqueue on CUDA buffers vs the torch op ----------------------------------------------------------

GPU_CASES = [  # (id, sequence lengths, heads, kv heads, head_dim, dtype, block)
    ("8k", [8192], 32, 8, 128, "bfloat16", 128),
    ("128k", [131072], 32, 8, 128, "bfloat16", 128),
    ("varlen", [1000, 4096, 37, 8197, 64], 32, 8, 128, "float16", 128),
    ("gqa9-3-d64", [8192], 9, 3, 64, "bfloat16", 64),
    ("gqa9-3-d64-b128", [3000, 5000], 9, 3, 64, "float16", 128),
]


@pytest.fixture(scope="session")
def harness(built):
    import torch
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the plugin's enqueue needs one")
    import aot_harness
    spec = importlib.util.find_spec("tensorrt_lean_libs")
    runtime = Path(spec.origin).parent / "libnvinfer_lean.so.11" if spec and spec.origin else None
    return aot_harness.Harness(built, str(runtime) if runtime and runtime.is_file() else None)


@pytest.mark.parametrize("case", GPU_CASES, ids=[c[0] for c in GPU_CASES])
def test_enqueue_matches_the_torch_op(harness, case):
    import dataclasses
    import aot_harness
    import torch
    _, lens, heads, kv_heads, d, dtype, block = case
    dtype = getattr(torch, dtype)
    cfg = dataclasses.replace(aot_harness.DENSE, block_size=block)
    out, ref, _, _, handle = aot_harness.run_both(harness, lens, heads, kv_heads, d, dtype, cfg)
    harness.destroy(handle)
    diff = (out.float() - ref.float()).abs().max().item()
    ulp = torch.finfo(dtype).eps * ref.float().abs().max().item()
    print(f"{case[0]}: max |plugin - torch op| = {diff:.3g} (1 ulp of max |out| = {ulp:.3g}); "
          f"registry: {harness.runtime or 'getCreators'}")
    assert torch.isfinite(out).all() and diff <= ulp
