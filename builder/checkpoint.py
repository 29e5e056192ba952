"""Checkpoint inspection for crisp-build, without loading weights: HF directory (config.json +
*.safetensors) or GGUF header, the architecture check (Llama family, Qwen2 included), --max-seq against
the model's RoPE range, and the default model.

It sits below cli, artifact and engine (it imports none of them), so BuildError lives here.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

SUPPORTED_ARCHITECTURES = {
    # HF architectures of the Llama family (rmsnorm, RoPE, SwiGLU, GQA via num_key_value_heads; Qwen2 adds
    # q/k/v biases)
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "llama",
}
GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
ROPE_TYPES = ("linear", "dynamic", "yarn", "llama3")


class BuildError(Exception):
    """A user-facing error: printed as one clear message, exit status 2."""


def default_model(name: str | None = None) -> str:
    """The checkpoint of a bundled model by name ("smollm2", the default, or "qwen"); any other name is taken
    as a path. A missing bundled model is a BuildError saying what to install."""
    from crisp_trt.models import BUNDLED, model_path

    try:
        return model_path(name)
    except (ImportError, FileNotFoundError, ValueError) as exc:
        which = name or "smollm2"
        raise BuildError(f"--model {which}: the bundled model is not installed ({exc}); or pass --model CKPT") \
            if which.lower() in BUNDLED else BuildError(str(exc))


def unsupported(what: str) -> str:
    names = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
    gguf_names = ", ".join(sorted(GGUF_ARCHITECTURES))
    return (f"unsupported architecture: {what}. Supported: the Llama family ({names}; GQA via "
            f"num_key_value_heads included; GGUF: general.architecture one of {gguf_names})")


def _read_hf_config(model: Path) -> dict:
    cfg_path = model / "config.json"
    if not cfg_path.is_file():
        raise BuildError(f"--model {model}: not a checkpoint directory: no config.json in it "
                         "(expected an HF checkpoint directory with config.json + *.safetensors, or a .gguf file)")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BuildError(f"--model {model}: config.json is not valid JSON ({exc})")
    if not isinstance(cfg, dict):
        raise BuildError(f"--model {model}: config.json holds a {type(cfg).__name__}, expected a JSON object")
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
        if f is None or not f.data:
            return default
        val = f.parts[f.data[0]]
        if f.types and f.types[0] == gguf.GGUFValueType.STRING:
            return bytes(val).decode()
        return val.tolist()[0] if hasattr(val, "tolist") else val

    arch = field("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise BuildError(unsupported(f"GGUF architecture {arch!r}"))
    heads = int(field(f"{arch}.attention.head_count", 0) or 0)
    cfg = {
        "architectures": [GGUF_ARCHITECTURES[arch]],
        "max_position_embeddings": int(field(f"{arch}.context_length", 0) or 0),
        "num_attention_heads": heads,
        "num_key_value_heads": int(field(f"{arch}.attention.head_count_kv", 0) or heads),
        "num_hidden_layers": int(field(f"{arch}.block_count", 0) or 0),
        "hidden_size": int(field(f"{arch}.embedding_length", 0) or 0),
        "rope_theta": float(field(f"{arch}.rope.freq_base", 10000.0)),
    }
    scaling, factor = field(f"{arch}.rope.scaling.type"), field(f"{arch}.rope.scaling.factor")
    if scaling and scaling != "none" and factor:
        cfg["rope_scaling"] = {"rope_type": scaling, "factor": float(factor)}
    return cfg


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


def rope_factor(hf_cfg: dict) -> float:
    """The checkpoint's own RoPE scaling factor (rope_scaling, or transformers 5's rope_parameters); 1 if none."""
    for key in ("rope_scaling", "rope_parameters"):
        scaling = hf_cfg.get(key)
        if isinstance(scaling, dict) and scaling.get("factor"):
            return float(scaling["factor"])
    return 1.0


def check_max_seq(max_seq: int | None, hf_cfg: dict, rope_scaling: str | None) -> tuple[int, dict | None]:
    """The --max-seq to build for, and the rope_scaling to write (None = the model's own).

    The limit is max_position_embeddings × the RoPE factor (--rope-scaling's, else the checkpoint's); YaRN and
    llama3 scaling record the native length as original_max_position_embeddings (Qwen2.5: 32768 × yarn:4 =
    131072 tokens)."""
    native = int(hf_cfg.get("max_position_embeddings") or 0)
    factor = rope_factor(hf_cfg)
    new_scaling = None
    if rope_scaling:
        m = re.fullmatch(r"(\w+):(\d+(?:\.\d+)?)", rope_scaling)
        if not m or m.group(1) not in ROPE_TYPES or float(m.group(2)) < 1:
            raise BuildError(f"--rope-scaling {rope_scaling!r}: expected TYPE:FACTOR with TYPE one of "
                             f"{', '.join(ROPE_TYPES)} and FACTOR >= 1 (e.g. linear:4 or yarn:4)")
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
