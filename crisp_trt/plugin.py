"""The TensorRT plugin CrispPrefillAttention (plugin/): locate libcrisp_trt_plugin.so, load it into a
TensorRT plugin registry, and describe a CrispConfig as the plugin's fields.

TensorRT is imported lazily: `plugin_fields` and `library_path` work without it.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from .config import CrispConfig

NAME, VERSION, NAMESPACE = "CrispPrefillAttention", "1", "crisp"
LIBRARY = "libcrisp_trt_plugin.so"
ENV_LIBRARY = "CRISP_TRT_PLUGIN_LIB"
INSTALL_HINT = "pip install tensorrt-cu13-bindings tensorrt-lean-cu13-libs"
HEAD_DIMS = (64, 128, 256)
_ROOT = Path(__file__).resolve().parent.parent


def library_path() -> Path:
    """$CRISP_TRT_PLUGIN_LIB, else the library next to this package or in the repository's build/plugin."""
    env = os.environ.get(ENV_LIBRARY)
    candidates = [Path(env)] if env else [
        Path(__file__).resolve().parent / "lib" / LIBRARY, _ROOT / "build" / "plugin" / LIBRARY]
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{LIBRARY} not found (looked at {', '.join(map(str, candidates))}); build it with "
        f"scripts/build_plugin.sh (needs TensorRT headers) or set {ENV_LIBRARY}")


def plugin_fields(config: CrispConfig, num_heads: int, num_kv_heads: int, head_dim: int
                  ) -> list[tuple[str, np.ndarray, str]]:
    """(name, value, type) per plugin field, in the plugin's order; type is "INT32", "FLOAT32" or "CHAR".

    Values are numpy arrays whose bytes are the field data (strings as uint8 characters, no NUL).
    """
    for name, value in (("num_heads", num_heads), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name}={value!r}: expected an int")
    if not 1 <= num_heads <= 1024:
        raise ValueError(f"num_heads={num_heads}: expected an int in [1, 1024]")
    if not (1 <= num_kv_heads <= num_heads and num_heads % num_kv_heads == 0):
        raise ValueError(f"num_kv_heads={num_kv_heads}: expected a divisor of num_heads={num_heads}")
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim={head_dim}: expected one of {HEAD_DIMS}")
    values = dict(config.to_dict(), num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim)
    kinds = {f.name: f.type for f in dataclasses.fields(CrispConfig)}
    fields = []
    for name, value in values.items():
        kind = kinds.get(name, "int")
        if kind == "str":
            fields.append((name, np.frombuffer(value.encode("ascii"), dtype=np.uint8).copy(), "CHAR"))
        elif kind == "float":
            fields.append((name, np.array([value], dtype=np.float32), "FLOAT32"))
        else:
            fields.append((name, np.array([value], dtype=np.int32), "INT32"))
    return fields


def tensorrt():
    """The TensorRT Python module (`tensorrt`, else the standalone `tensorrt_bindings`)."""
    errors = []
    for module in ("tensorrt", "tensorrt_bindings"):
        try:
            return __import__(module)
        except (ImportError, OSError) as e:
            errors.append(f"{module}: {e}")
    raise ImportError(f"the TensorRT Python bindings are not importable ({'; '.join(errors)}); "
                      f"install them with `{INSTALL_HINT}` (building engines also needs the full TensorRT)")


def field_collection(config: CrispConfig, num_heads: int, num_kv_heads: int, head_dim: int, trt=None):
    """A trt.PluginFieldCollection of the plugin's fields (for creator.create_plugin)."""
    trt = trt or tensorrt()
    types = {"INT32": trt.PluginFieldType.INT32, "FLOAT32": trt.PluginFieldType.FLOAT32,
             "CHAR": trt.PluginFieldType.CHAR}
    return trt.PluginFieldCollection([trt.PluginField(name, value, types[kind])
                                      for name, value, kind in plugin_fields(config, num_heads, num_kv_heads,
                                                                             head_dim)])


def load(registry=None, path: str | os.PathLike | None = None):
    """Load the library into `registry` (default: TensorRT's global one) and return the plugin's creator."""
    library = Path(path) if path else library_path()
    registry = registry or tensorrt().get_plugin_registry()
    if registry.load_library(str(library)) is None:
        raise RuntimeError(f"TensorRT could not load {library}")
    creator = registry.get_creator(NAME, VERSION, NAMESPACE)
    if creator is None:
        raise RuntimeError(f"{library} loaded but no creator {NAMESPACE}::{NAME} v{VERSION} is registered")
    return creator
