"""TensorRT engines that contain CRISP: the artifact's prefill graph (onnx_export, a CrispPrefillAttention
node in every attention layer) → TensorRT's ONNX parser (the plugin found in the global registry, loaded
through crisp_trt.plugin) → a serialised plan.

The builder module is imported lazily: the full TensorRT (`tensorrt`) or TensorRT-RTX (`tensorrt_rtx`, or
the standalone wheel's `tensorrt_rtx_bindings`; the same nvinfer1 builder API). Without one every entry
point raises a BuildError saying what to install. What is verified where: builder/README.md (which also keeps
the TensorRT-LLM 1.2 path as a design note: why CRISP stops at this ONNX route).
"""
from __future__ import annotations

import functools
import importlib.util
import json
import time
from pathlib import Path

from crisp_trt import plugin

from .checkpoint import BuildError

PLAN = "crisp.plan"
ONNX = "onnx/model.onnx"


def builder_module() -> str | None:
    """Name of the first TensorRT builder module that is installed (not imported), or None."""
    return next((m for m in plugin.BUILDER_MODULES if importlib.util.find_spec(m) is not None), None)


def tensorrt_available() -> bool:
    """A builder module is installed and the plugin library is built: the default backend can be tensorrt."""
    if builder_module() is None:
        return False
    try:
        plugin.library_path()
    except FileNotFoundError:
        return False
    return True


@functools.cache
def require_builder(library: str | Path | None = None):
    """(trt module, plugin creator): a TensorRT builder with CrispPrefillAttention in its global registry. Cached:
    crisp-build asks at the start, before the export and in build_plan; a failure is not cached."""
    try:
        trt = plugin.tensorrt(builder=True)
    except ImportError as exc:
        raise BuildError(f"--backend tensorrt: {exc}; or use --backend torch")
    try:
        creator = plugin.load(path=library, trt=trt)
    except (FileNotFoundError, RuntimeError) as exc:
        raise BuildError(f"--backend tensorrt: the CrispPrefillAttention plugin is not loadable into {trt.__name__}'s "
                         f"registry: {exc}")
    return trt, creator


def make_logger(trt, verbose: bool = False):
    """A trt.ILogger that keeps every (severity, message) in .messages (errors go into BuildErrors) and prints
    warnings and errors (everything when verbose)."""

    class Logger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)
            self.messages = []

        def log(self, severity, msg):
            self.messages.append((severity, msg))
            if verbose or int(severity) <= int(trt.ILogger.Severity.WARNING):
                print(f"[{trt.__name__} {severity.name}] {msg}", flush=True)

        def errors(self) -> str:
            return "; ".join(m for s, m in self.messages if int(s) <= int(trt.ILogger.Severity.ERROR))

    return Logger()


def network_flags(trt) -> int:
    """Strongly typed where the builder has the flag (TensorRT 10+; TensorRT-RTX's networks are always typed)."""
    flag = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    return 0 if flag is None else 1 << int(flag)


def plugin_layers(trt, network) -> list:
    """The network's plugin layers (IPluginV3, or older kinds), in order."""
    kinds = {getattr(trt.LayerType, k) for k in ("PLUGIN_V3", "PLUGIN_V2", "PLUGIN") if hasattr(trt.LayerType, k)}
    return [network.get_layer(i) for i in range(network.num_layers) if network.get_layer(i).type in kinds]


def parse_onnx(trt, builder, logger, onnx_path: Path):
    """(network, parser) TensorRT's ONNX parser makes of `onnx_path` (external data beside it); the parser must
    outlive the build (it holds the weights). BuildError naming the parser's errors."""
    network = builder.create_network(network_flags(trt))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise BuildError(f"TensorRT's ONNX parser rejected {onnx_path}: {errors}")
    return network, parser


def build_plan(onnx_path: str | Path, plan_path: str | Path, max_tokens: int, max_batch: int = 4,
               opt_tokens: int | None = None, library: str | Path | None = None, verbose: bool = False) -> dict:
    """Parse the CRISP prefill graph at `onnx_path`, build with one optimisation profile (input_ids 1 ..
    max_tokens, cu_seqlens 2 .. max_batch + 1) and write the serialised plan. Returns a record: builder
    module and version, plugin layers, layers, plan bytes, build seconds."""
    if max_tokens < 1 or max_batch < 1:
        raise BuildError(f"max_tokens={max_tokens}, max_batch={max_batch}: expected both >= 1")
    trt, _ = require_builder(library)
    logger = make_logger(trt, verbose)
    builder = trt.Builder(logger)
    if builder is None:
        raise BuildError(f"{trt.__name__}.Builder could not be created (no CUDA device, or only a runtime "
                         f"installed): {plugin.BUILDER_HINT}")
    network, _parser = parse_onnx(trt, builder, logger, Path(onnx_path))  # the parser holds the weights: kept
    crisp = plugin_layers(trt, network)
    opt = min(opt_tokens or min(max_tokens, 8192), max_tokens)
    profile = builder.create_optimization_profile()
    profile.set_shape("input_ids", (1,), (opt,), (max_tokens,))
    profile.set_shape("cu_seqlens", (2,), (2,), (max_batch + 1,))
    config = builder.create_builder_config()
    config.add_optimization_profile(profile)
    t0 = time.time()
    plan = builder.build_serialized_network(network, config)
    seconds = time.time() - t0
    if plan is None:
        raise BuildError(f"{trt.__name__} could not build {onnx_path}: {logger.errors() or 'no error logged'}")
    plan_path = Path(plan_path)
    plan_path.parent.mkdir(parents=True, exist_ok=True)
    plan_path.write_bytes(bytes(plan))
    return {"builder": trt.__name__, "version": getattr(trt, "__version__", "?"), "plan": str(plan_path),
            "plan_bytes": plan_path.stat().st_size, "layers": network.num_layers, "plugin_layers": len(crisp),
            "plugin_layer_names": [layer.name for layer in crisp], "build_s": round(seconds, 2),
            "profile": {"input_ids": [1, opt, max_tokens], "cu_seqlens": [2, 2, max_batch + 1]}}


def export_artifact(artifact: str | Path, onnx_path: str | Path | None = None, dtype: str = "bf16") -> Path:
    """The artifact's CRISP prefill graph (its per-layer calibrated configs) in `dtype` (fp32 | fp16 | bf16)."""
    from crisp_trt import runtime
    from crisp_trt.config import CrispConfig

    from .artifact import load_checkpoint
    from .onnx_export import export

    artifact = Path(artifact)
    try:
        crisp = runtime.read_crisp(artifact)
    except ValueError as exc:
        raise BuildError(str(exc)) from None
    configs = runtime.layer_configs(crisp) or CrispConfig.from_dict(crisp["config"])
    model, _ = load_checkpoint(artifact, dtype)
    return export(model, onnx_path or artifact / ONNX, configs)


def build_engine(artifact: str | Path, max_seq: int, dtype: str = "auto", max_batch: int = 4,
                 library: str | Path | None = None) -> dict:
    """crisp-build --backend tensorrt after the artifact: export its graph, build DIR/engines/crisp.plan, and
    record the engine in config.json's crisp section ("backend": "tensorrt", "engine": build_plan's record)."""
    require_builder(library)  # fail before the export when the toolchain is missing
    artifact = Path(artifact)
    graph_dtype = dtype if dtype in ("fp16", "bf16") else "bf16"  # the plugin takes half types
    onnx_path = export_artifact(artifact, artifact / ONNX, graph_dtype)
    record = build_plan(onnx_path, artifact / "engines" / PLAN, max_tokens=max_seq, max_batch=max_batch,
                        library=library)
    record.update(onnx=str(onnx_path), dtype=graph_dtype)
    cfg_path = artifact / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["crisp"].update(backend="tensorrt", engine=record)
    cfg_path.write_text(json.dumps(cfg, indent=2))
    return record

