"""TensorRT-LLM engine path, imported lazily: needs TensorRT + TensorRT-LLM <= 1.2.x.

TensorRT-LLM removed its TensorRT-engine flow (trtllm-build, tensorrt_llm.functional, the GPTAttention
plugin) from main in July 2026; 1.2.x / 1.3.0rc20 are the last releases with it (DESIGN.md §5).
Neither wheel installs from PyPI alone (NVIDIA's index / containers), so nothing here runs in CI;
see builder/README.md for what is and is not verified.
"""
from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

INSTALL_HINT = ("the tensorrt backend needs TensorRT and TensorRT-LLM <= 1.2.x (the last releases with the "
                "TensorRT-engine flow), e.g. NVIDIA's TensorRT-LLM 1.2 container, or "
                "pip install 'tensorrt_llm<=1.2.99' --extra-index-url https://pypi.nvidia.com; "
                "use --backend torch otherwise")


class TensorRTMissing(RuntimeError):
    pass


def tensorrt_available() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("tensorrt", "tensorrt_llm"))


def require_tensorrt():
    """Import tensorrt and tensorrt_llm or raise a BuildError naming what to install."""
    from .cli import BuildError

    missing = [name for name in ("tensorrt", "tensorrt_llm") if importlib.util.find_spec(name) is None]
    if missing:
        raise BuildError(f"{' and '.join(missing)} not importable: {INSTALL_HINT}")
    trt = importlib.import_module("tensorrt")
    tllm = importlib.import_module("tensorrt_llm")
    version = getattr(tllm, "__version__", "0")
    major_minor = tuple(int(x) for x in version.split(".")[:2] if x.isdigit())
    if major_minor > (1, 3):
        raise BuildError(f"tensorrt_llm {version} has no TensorRT-engine flow (removed after 1.3.0rc20): "
                         + INSTALL_HINT)
    return trt, tllm


def build_engines(ckpt_dir: str | Path, engine_dir: str | Path, max_seq: int, plugin_library: str | None = None,
                  max_batch_size: int = 8) -> list[Path]:
    """Build rank{N}.engine from a TensorRT-LLM checkpoint with TensorRT-LLM 1.2's builder.

    UNVERIFIED here (no TensorRT-LLM on any project machine). Uses the 1.2 public API:
    tensorrt_llm.builder.build(model, BuildConfig) on LLaMAForCausalLM.from_checkpoint per rank,
    then engine.save(). The CRISP plugin replacing the GPTAttention plugin's context phase is the
    design in builder/README.md; this function builds with TensorRT-LLM's own attention plugin.
    """
    require_tensorrt()
    from tensorrt_llm import Mapping  # noqa: F401  (1.2 API)
    from tensorrt_llm.builder import BuildConfig, build
    from tensorrt_llm.models import LLaMAForCausalLM

    import json

    ckpt_dir, engine_dir = Path(ckpt_dir), Path(engine_dir)
    engine_dir.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((ckpt_dir / "config.json").read_text())
    world = cfg["mapping"]["world_size"]
    build_config = BuildConfig(max_input_len=max_seq, max_seq_len=max_seq, max_batch_size=max_batch_size,
                               max_num_tokens=min(max_seq, 16384))
    if plugin_library:
        import ctypes

        ctypes.CDLL(plugin_library, mode=ctypes.RTLD_GLOBAL)
    out = []
    for rank in range(world):
        model = LLaMAForCausalLM.from_checkpoint(str(ckpt_dir), rank=rank)
        engine = build(model, build_config)
        engine.save(str(engine_dir))
        out.append(engine_dir / f"rank{rank}.engine")
    return out
