"""The TensorRT plugin CrispPrefillAttention (plugin/): locate libcrisp_trt_plugin.so, load it into a
TensorRT plugin registry, and describe a CrispConfig as the plugin's fields (PluginFields, or ONNX node
attributes for TensorRT's ONNX parser).

TensorRT is imported lazily: `plugin_fields`, `onnx_attributes` and `library_path` work without it. The
Python module may be the full TensorRT (`tensorrt`), TensorRT-RTX (`tensorrt_rtx`, or the standalone wheel's
`tensorrt_rtx_bindings`: the same nvinfer1 builder API) or, for the registry alone, the standalone
`tensorrt_bindings` with the lean runtime.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
from pathlib import Path

import numpy as np

from .config import CrispConfig
from .kernels import contract

NAME, VERSION, NAMESPACE = "CrispPrefillAttention", "1", "crisp"
LIBRARY = "libcrisp_trt_plugin.so"
ENV_LIBRARY = "CRISP_TRT_PLUGIN_LIB"
INSTALL_HINT = "pip install tensorrt-cu13-bindings tensorrt-lean-cu13-libs"
BUILDER_HINT = ("pip install tensorrt-rtx-cu13-libs tensorrt-rtx-cu13-bindings (TensorRT-RTX 1.7: builds and "
                "serialises engines; its runtime needs a GPU it supports) or the full TensorRT "
                "(pip install tensorrt-cu13)")
RUNTIME_MODULES = ("tensorrt", "tensorrt_bindings", "tensorrt_rtx", "tensorrt_rtx_bindings")
BUILDER_MODULES = ("tensorrt", "tensorrt_rtx", "tensorrt_rtx_bindings")
ONNX_DOMAIN = NAMESPACE  # the ONNX node's domain; the parser maps it through plugin_namespace / plugin_version
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


def plugin_fields(config: CrispConfig, num_heads: int, num_kv_heads: int, head_dim: int, *, chunked: bool = False,
                  return_lse: bool = False) -> list[tuple[str, np.ndarray, str]]:
    """(name, value, type) per plugin field, in the plugin's order; type is "INT32", "FLOAT32" or "CHAR".

    Values are numpy arrays whose bytes are the field data (strings as uint8 characters, no NUL). chunked (a fifth
    input, cu_seqlens_k: a chunk's queries are the last positions of its keys) and return_lse (a second output,
    the LSE [tokens, num_heads] f32) are optional fields, given only when set: the plugin serialises them so too.
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
    values = dict(config.to_dict(), num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                  chunked=int(chunked), return_lse=int(return_lse))
    fields = []
    for name, kind in contract.FIELDS:  # the plugin's order and types; an optional field only off its default
        if name in contract.OPTIONAL and values[name] == contract.OPTIONAL[name]:
            continue
        value = values[name]
        if kind == "CHAR":
            fields.append((name, np.frombuffer(value.encode("ascii"), dtype=np.uint8).copy(), kind))
        else:
            fields.append((name, np.array([value], dtype=np.float32 if kind == "FLOAT32" else np.int32), kind))
    return fields


def tensorrt(builder: bool = False):
    """The TensorRT Python module: with builder=False the first of RUNTIME_MODULES that imports (a registry is
    enough), with builder=True the first of BUILDER_MODULES (Builder + OnnxParser: full TensorRT or TensorRT-RTX)."""
    errors = []
    for module in (BUILDER_MODULES if builder else RUNTIME_MODULES):
        try:
            trt = importlib.import_module(module)
        except (ImportError, OSError) as e:
            errors.append(f"{module}: {e}")
            continue
        if builder and is_rtx(trt):
            rtx_parser_link()
        return trt
    if builder:
        raise ImportError(f"no TensorRT builder is importable ({'; '.join(errors)}); install one: {BUILDER_HINT}")
    raise ImportError(f"the TensorRT Python bindings are not importable ({'; '.join(errors)}); "
                      f"install them with `{INSTALL_HINT}` (building engines needs a builder: {BUILDER_HINT})")


def is_rtx(trt) -> bool:
    """Whether a TensorRT module is TensorRT-RTX's (`tensorrt_rtx`, `tensorrt_rtx_bindings`): its builder needs no
    GPU, and its ONNX parser needs `rtx_parser_link`."""
    return trt.__name__.startswith("tensorrt_rtx")


def rtx_parser_link(libs_dir: Path | None = None) -> Path | None:
    """TensorRT-RTX 1.7's ONNX parser reaches addPluginV3 by dlopen("libtensorrt_rtx.so") through its $ORIGIN
    rpath and std::terminates when that fails; the PyPI libs wheel (tensorrt_rtx_libs) ships only
    libtensorrt_rtx.so.1. Adds the unversioned link beside it (an SDK install has it already; a dangling one is
    replaced) and returns its path; None where there is no such wheel."""
    if libs_dir is None:
        try:
            libs_dir = Path(importlib.import_module("tensorrt_rtx_libs").__file__).parent
        except ImportError:
            return None
    link, target = libs_dir / "libtensorrt_rtx.so", libs_dir / "libtensorrt_rtx.so.1"
    if link.exists():
        return link
    if not target.exists():
        return None
    try:
        if link.is_symlink():  # dangling (its target moved or was removed): replace it
            link.unlink(missing_ok=True)  # another process may have replaced it already
        link.symlink_to(target.name)
    except FileExistsError:
        pass  # another process made it
    except OSError as e:
        raise ImportError(f"TensorRT-RTX's ONNX parser needs {link} (the libs wheel ships only {target.name}, and a "
                          f"plugin node aborts the parser without it), and it cannot be created here ({e}): run "
                          f"`ln -s {target.name} {link}` once") from e
    return link


def onnx_attributes(config: CrispConfig, num_heads: int, num_kv_heads: int, head_dim: int, *, chunked: bool = False,
                    return_lse: bool = False) -> dict:
    """The ONNX node attributes of one CrispPrefillAttention: every plugin field (INT32 → int, FLOAT32 → the
    float32 value, CHAR → str; the optional chunked / return_lse only when set) plus plugin_namespace /
    plugin_version, which TensorRT's ONNX parser uses to find the creator when it falls back to a plugin for an
    unknown op."""
    attrs = {}
    for name, value, kind in plugin_fields(config, num_heads, num_kv_heads, head_dim, chunked=chunked,
                                           return_lse=return_lse):
        attrs[name] = (bytes(value).decode("ascii") if kind == "CHAR"
                       else float(value[0]) if kind == "FLOAT32" else int(value[0]))
    attrs.update(plugin_namespace=NAMESPACE, plugin_version=VERSION)
    return attrs


def config_of_attributes(attrs: dict) -> tuple[CrispConfig, int, int, int]:
    """Inverse of onnx_attributes: (CrispConfig, num_heads, num_kv_heads, head_dim). A float field comes back
    as the shortest decimal of its float32 value (0.999 stays 0.999), the CrispConfig that was exported. The
    optional fields are read with `options_of_attributes`."""
    kinds = {f.name: f.type for f in dataclasses.fields(CrispConfig)}
    attrs = {**{n: v for n, v in contract.OPTIONAL.items() if n in kinds}, **attrs}  # optional: absent = default
    missing = sorted(set(kinds) - set(attrs))
    if missing:
        raise ValueError(f"{NAME} node attributes: missing {missing}")
    values = {name: (float(str(np.float32(attrs[name]))) if kind == "float" else
                     str(attrs[name]) if kind == "str" else int(attrs[name])) for name, kind in kinds.items()}
    return (CrispConfig.from_dict(values), int(attrs["num_heads"]), int(attrs["num_kv_heads"]),
            int(attrs["head_dim"]))


def options_of_attributes(attrs: dict) -> dict:
    """The optional fields of onnx_attributes' output that are not CrispConfig's: {"chunked": bool, "return_lse":
    bool} (absent = off)."""
    config = {f.name for f in dataclasses.fields(CrispConfig)}
    return {name: bool(int(attrs.get(name, 0))) for name in contract.OPTIONAL if name not in config}


def field_collection(config: CrispConfig, num_heads: int, num_kv_heads: int, head_dim: int, trt=None, *,
                     chunked: bool = False, return_lse: bool = False):
    """A trt.PluginFieldCollection of the plugin's fields (for creator.create_plugin).

    trt.PluginField points into its numpy array without holding it, so the collection (a subclass of the
    bindings' class) holds the arrays: without that, the fields read freed memory (seen: block_size came
    out as garbage and createPlugin refused it)."""
    trt = trt or tensorrt()
    types = {"INT32": trt.PluginFieldType.INT32, "FLOAT32": trt.PluginFieldType.FLOAT32,
             "CHAR": trt.PluginFieldType.CHAR}
    fields = plugin_fields(config, num_heads, num_kv_heads, head_dim, chunked=chunked, return_lse=return_lse)
    keeping = _KEEPING.setdefault(trt.PluginFieldCollection,
                                  type("CrispPluginFields", (trt.PluginFieldCollection,), {}))
    collection = keeping([trt.PluginField(name, value, types[kind]) for name, value, kind in fields])
    collection.arrays = [value for _, value, _ in fields]
    return collection


_KEEPING: dict = {}


_LOADED: set[str] = set()  # libraries this process has loaded into a registry


def load(registry=None, path: str | os.PathLike | None = None, trt=None):
    """Load the library into `registry` (default: the global registry of `trt`, else of `tensorrt()`) and return
    the plugin's creator. TensorRT's ONNX parser finds the plugin in that global registry."""
    library = Path(path) if path else library_path()
    registry = registry or (trt or tensorrt()).get_plugin_registry()
    key = str(library.resolve())
    if registry.load_library(str(library)) is None and key not in _LOADED:  # a second load answers None too
        raise RuntimeError(f"TensorRT could not load {library}")
    _LOADED.add(key)
    creator = registry.get_creator(NAME, VERSION, NAMESPACE)
    if creator is None:
        raise RuntimeError(f"{library} loaded but no creator {NAMESPACE}::{NAME} v{VERSION} is registered")
    return creator
