"""The artifact directory: load → (calibrate) → save HF weights + config.json with the CRISP section.

DIR/config.json is the model's HF config plus a "crisp" section:
  {"format", "backend", "max_seq", "dtype", "source", "config": CrispConfig.to_dict(),
   "layers": [{"kappa", "tau"} per layer], "calibration": {...}}
"format" is crisp_trt.runtime.FORMAT, the one version the runtime reads (it refuses others, saying to rebuild).
DIR/*.safetensors (model dtype), tokenizer files; crisp-build --backend tensorrt then adds DIR/onnx/ and DIR/engines/ (engine.build_engine).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from crisp_trt.config import CrispConfig
from crisp_trt.runtime import FORMAT
_TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def load_checkpoint(model: str | Path, dtype: str = "auto"):
    """(model, tokenizer) from an HF directory or a .gguf file, dense (SDPA) attention, eval mode, CPU, with
    the checkpoint's own LM head (the weights are saved as they are)."""
    from crisp_trt.models import load_model

    if model is None:
        raise ValueError("model: expected a checkpoint directory or a .gguf file, got None")
    return load_model(model, "sdpa", dtype=None if dtype == "auto" else _TORCH_DTYPES[dtype], logits32=False)


def save_weights(mdl, out: Path) -> None:
    """safetensors in the model's dtype (GGUF-loaded models are dequantised: saved as plain weights)."""
    from crisp_trt.models import as_plain_weights

    as_plain_weights(mdl).save_pretrained(out, safe_serialization=True)


def build(model, output, max_seq: int, dtype: str = "auto", calibrate_tokens: int = 512, recall: float = 0.98,
          block_size: int | None = None, tp: int = 1, rope_scaling: dict | None = None,
          seed: int = 0, progress: bool = True, base: CrispConfig | None = None) -> Path:
    from tqdm import tqdm

    from .calibrate import calibrate

    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    steps = tqdm(total=3, desc="crisp-build", disable=not progress, unit="step")
    t0 = time.time()
    steps.set_postfix_str("loading checkpoint")
    mdl, tok = load_checkpoint(model, dtype)
    if rope_scaling:
        from crisp_trt.models import set_rope_scaling

        set_rope_scaling(mdl, rope_scaling)  # transformers 5 reads rope_parameters; a bare rope_scaling is lost
    steps.update()
    base = base or CrispConfig()
    if block_size is not None:
        base = base.replace(block_size=block_size)
    if 0 < calibrate_tokens < 16 * base.block_size:
        print(f"crisp-build: warning: --calibrate {calibrate_tokens} is under 16 blocks of {base.block_size} tokens; "
              f"the thresholds it picks say little about long prompts (use >= {16 * base.block_size})",
              file=sys.stderr)
    layers_n = mdl.config.num_hidden_layers
    if calibrate_tokens > 0:
        steps.set_postfix_str(f"calibrating on {calibrate_tokens} tokens")
        base, record = calibrate(mdl, tok, calibrate_tokens, base, recall, seed, progress)
        layers = [{"kappa": l["kappa"], "tau": l["tau"]} for l in record["layers"]]
    else:
        record, layers = None, [{"kappa": base.kappa, "tau": base.tau} for _ in range(layers_n)]
    steps.update()
    steps.set_postfix_str("saving weights")
    save_weights(mdl, out)
    tok.save_pretrained(out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["max_position_embeddings"] = max(int(cfg.get("max_position_embeddings") or 0), 0) or max_seq
    cfg["crisp"] = {
        "format": FORMAT, "backend": "torch", "max_seq": max_seq, "dtype": dtype,
        "weights_dtype": str(next(mdl.parameters()).dtype).replace("torch.", ""),
        "source": str(model), "tp": tp, "config": base.to_dict(), "layers": layers, "calibration": record,
    }
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    steps.update()
    steps.close()
    print(f"crisp-build: {layers_n} layers, calibration "
          + (f"recall {record['mean_recall']:.4f} at density {record['mean_density']:.3f}"
             + (" (global defaults confirmed)" if record["defaults_confirmed"] else " (per-layer kappa/tau)")
             if record else "skipped (defaults)") + f", {time.time() - t0:.1f} s", flush=True)
    return out
