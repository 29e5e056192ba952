"""Run a crisp-build torch artifact: `load(DIR)` → a model that generates with CRISP prefill.

HF transformers underneath, with crisp_trt.hf's "crisp" attention: prefill (query length == key length,
no padding) goes through crisp_trt.crisp_prefill_attention with the artifact's per-layer calibrated
config (hf.set_crisp_config with one config per layer); decode steps use SDPA.
`crisp-run DIR --prompt ...` prints the completion and the TTFT.
"""
from __future__ import annotations

import argparse
import functools
import inspect
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import CrispConfig


@dataclass
class Generation:
    text: str
    token_ids: list
    ttft_s: float
    total_s: float
    prompt_tokens: int


class CrispModel:
    """An HF causal LM with CRISP prefill (attention="crisp"), dense SDPA (attention="dense") or dense through
    HF's eager kernels (attention="eager": the same maths as SDPA with other rounding, the benches' control)."""

    def __init__(self, model, tokenizer, crisp: dict, attention: str = "crisp"):
        from .hf import set_crisp_config

        self.model, self.tokenizer, self.crisp = model, tokenizer, crisp
        self.layer_configs = layer_configs(crisp)
        set_crisp_config(model, self.layer_configs)
        self.set_attention(attention)

    def set_attention(self, attention: str) -> None:
        implementation = {"crisp": "crisp", "dense": "sdpa", "eager": "eager"}.get(attention)
        if implementation is None:
            raise ValueError(f"attention={attention!r}: expected 'crisp', 'dense' or 'eager'")
        from .models import set_attn_implementation

        set_attn_implementation(self.model, implementation)
        self.attention = attention

    @property
    def device(self):
        return next(self.model.parameters()).device

    def encode(self, prompt: str, chat: bool = False) -> torch.Tensor:
        if chat and getattr(self.tokenizer, "chat_template", None):
            ids = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                     return_tensors="pt")
            ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
        else:
            ids = self.tokenizer(prompt, return_tensors="pt").input_ids
        return ids.to(self.device)

    def generate_ids(self, input_ids: torch.Tensor, max_new_tokens: int = 32) -> tuple[list, float, float]:
        """Greedy decoding; returns (new token ids, TTFT seconds, total seconds)."""
        sync = torch.cuda.synchronize if input_ids.is_cuda else (lambda: None)
        sync()
        t0 = time.perf_counter()
        steps = greedy_steps(self.model, input_ids, max_new_tokens, self.tokenizer.eos_token_id)
        new = [next(steps)[0]]  # the prefill and its token
        sync()
        ttft = time.perf_counter() - t0
        new += [token for token, _ in steps]
        sync()
        return new, ttft, time.perf_counter() - t0

    def generate(self, prompt: str, max_new_tokens: int = 32, chat: bool = False) -> Generation:
        ids = self.encode(prompt, chat)
        new, ttft, total = self.generate_ids(ids, max_new_tokens)
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        return Generation(text, new, ttft, total, int(ids.shape[1]))


@functools.cache
def _cache_argument(model_class) -> str:
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


@torch.no_grad()  # torch's decorator re-enters no_grad around each resume, so the caller keeps its mode
def greedy_steps(model, ids: torch.Tensor, max_new_tokens: int, eos: int | None = None):
    """Greedy decoding of one sequence with an HF causal LM, one step at a time: yields (token, that step's
    logits as float [vocab]); stops after eos or max_new_tokens. The KV cache travels under the forward's
    own argument name (`cache` in transformers 5, `past_key_values` before)."""
    cache = _cache_argument(type(model))
    out = model(input_ids=ids, use_cache=True)
    for step in range(max_new_tokens):
        logits = out.logits[0, -1].float()
        token = int(logits.argmax())
        yield token, logits
        if token == eos or step + 1 == max_new_tokens:
            return
        out = model(input_ids=torch.tensor([[token]], device=ids.device), use_cache=True,
                    **{cache: getattr(out, cache)})


def read_crisp(artifact_dir) -> dict:
    """The "crisp" section of an artifact's config.json (builder/artifact.py writes it)."""
    cfg = json.loads((Path(artifact_dir) / "config.json").read_text())
    if "crisp" not in cfg:
        raise ValueError(f"{artifact_dir}/config.json has no 'crisp' section: not a crisp-build artifact")
    return cfg["crisp"]


def layer_configs(crisp: dict) -> list[CrispConfig]:
    """One CrispConfig per layer: the base config with that layer's calibrated kappa and tau."""
    base = CrispConfig.from_dict(crisp["config"])
    return [base.replace(kappa=float(l["kappa"]), tau=float(l["tau"])) for l in crisp["layers"]]


def load(artifact_dir, attention: str = "crisp", device: str | None = None, dtype=None) -> CrispModel:
    """Load a crisp-build torch artifact directory (a half-precision model keeps float32 logits:
    models.Float32Logits)."""
    from .models import load_model

    path = Path(artifact_dir)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: no config.json: not a crisp-build artifact (run crisp-build --output {path})")
    crisp = read_crisp(path)
    model, tok = load_model(path, "sdpa", dtype=dtype, device=device or None)
    return CrispModel(model, tok, crisp, attention)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="crisp-run", description="Generate with a crisp-build artifact (CRISP prefill).")
    p.add_argument("artifact", metavar="DIR", help="directory written by crisp-build --backend torch")
    p.add_argument("--prompt", required=True, help="prompt text ('-' reads stdin)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--attention", choices=("crisp", "dense"), default="crisp")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--device", default=None, help="cpu / cuda (default: cuda when available)")
    args = p.parse_args(argv)
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        model = load(args.artifact, args.attention, device)
    except (FileNotFoundError, ValueError) as exc:
        print(f"crisp-run: error: {exc}", file=sys.stderr)
        return 2
    gen = model.generate(prompt, args.max_new_tokens, chat=args.chat)
    print(gen.text)
    print(f"TTFT {gen.ttft_s * 1000:.1f} ms ({gen.prompt_tokens} prompt tokens, {args.attention} prefill), "
          f"{len(gen.token_ids)} tokens in {gen.total_s:.2f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
