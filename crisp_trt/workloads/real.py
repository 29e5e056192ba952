"""Real Q/K/V (docs/design.md, "Measuring"): post-RoPE query/key/value of a real model on real text.

Text source: the Debian package `base-files` (present on every Debian/Ubuntu system, installs with
apt) ships the full texts of the common free-software licences under /usr/share/common-licenses
(GPL-1/2/3, LGPL, GFDL, MPL, Apache-2.0, Artistic, CC0: ~260 KB of real English prose, ~60k
SmolLM2 tokens). `real_text()` concatenates them in a fixed order; `held_out_text()` is the
disjoint tail used for perplexity. Longer text (16k–128k tokens, prose and code) comes from the
corpora of `texts.py`; `text_ids(..., source=name)` reads either.

`capture(model, ids)` runs the model once with a temporary attention implementation that records what
transformers passes to attention (after the RoPE rotation), then answers with SDPA; `capture_qkv(n, layers)`
does it on n tokens of the licence text with the bundled SmolLM2.
"""
from __future__ import annotations

import functools
import glob
import os

import torch

LICENSE_DIR = "/usr/share/common-licenses"
ORDER = ("GPL-3", "GFDL-1.3", "LGPL-2.1", "MPL-2.0", "GPL-2", "Apache-2.0", "MPL-1.1", "LGPL-2", "GFDL-1.2",
         "GPL-1", "CC0-1.0", "LGPL-3", "Artistic", "BSD")
HELD_OUT = ("MPL-1.1", "LGPL-2", "GFDL-1.2", "GPL-1", "CC0-1.0", "LGPL-3", "Artistic", "BSD")


def real_text(paths=None, held_out: bool = False) -> str:
    """Real English text from Debian's base-files (licence texts); held_out=True gives the disjoint tail."""
    if paths is None:
        if not os.path.isdir(LICENSE_DIR):
            raise FileNotFoundError(f"{LICENSE_DIR} missing: it comes from Debian's base-files package "
                                    "(apt-get install base-files), or pass paths=[...] of text files")
        names = [n for n in ORDER if (n in HELD_OUT) == held_out]
        paths = [os.path.join(LICENSE_DIR, n) for n in names if os.path.isfile(os.path.join(LICENSE_DIR, n))]
        if not paths:
            paths = sorted(glob.glob(os.path.join(LICENSE_DIR, "*")))
    return "\n\n".join(open(p, encoding="utf-8", errors="replace").read() for p in paths)


def held_out_text() -> str:
    return real_text(held_out=True)


@functools.lru_cache(maxsize=8)
def _source_ids(tok, source: str) -> torch.Tensor:
    """A whole source text tokenised once per tokenizer (seconds each time otherwise: one per capture)."""
    from .texts import corpus

    text = {"licenses": real_text, "licenses_held_out": held_out_text}.get(source, lambda: corpus(source))()
    return tok(text, return_tensors="pt").input_ids[0]


def text_ids(tok, n: int, held_out: bool = False, offset: int = 0, source: str | None = None) -> torch.Tensor:
    """n token ids of real text from token `offset` on (the source repeated as needed), shape [1, n].
    source: a texts corpus name (workloads.texts), else the licence texts (held_out: their disjoint tail)."""
    if offset < 0:
        raise ValueError(f"offset={offset}: expected a token index >= 0")
    ids = _source_ids(tok, source or ("licenses_held_out" if held_out else "licenses"))
    reps = -(-(offset + n) // ids.numel())
    return ids.repeat(reps)[offset: offset + n][None]


def capture(model, ids: torch.Tensor, layers=None, out_device="cpu", dtype=torch.float32) -> dict:
    """{layer: (q, k, v)} of one forward of `model` on `ids` [1, n]: post-RoPE, q [1, n, H, d], k/v
    [1, n, H_kv, d], moved to `out_device` / `dtype` as each layer runs (so long captures can stay on the
    GPU in bf16). The one Q/K/V capture: the benchmarks and calibration both come through here. A
    temporary attention implementation records what transformers passes to attention, then answers with
    SDPA; the model's own implementation is restored afterwards."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    from ..models import set_attn_implementation

    wanted = set(range(model.config.num_hidden_layers)) if layers is None else set(layers)
    grabbed = {}

    def record(module, query, key, value, attention_mask, **kwargs):
        idx = getattr(module, "layer_idx", len(grabbed))
        if idx in wanted:
            grabbed[idx] = tuple(t.detach().transpose(1, 2).to(out_device, dtype).contiguous()
                                 for t in (query, key, value))
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("crisp_capture", record)
    AttentionMaskInterface.register("crisp_capture", sdpa_mask)
    before = model.config._attn_implementation
    set_attn_implementation(model, "crisp_capture")
    try:
        with torch.no_grad():
            model(ids.to(model.device), use_cache=False, logits_to_keep=1)
    finally:
        set_attn_implementation(model, before)
    return grabbed


def capture_qkv(n: int, layers=None, model=None, tok=None, held_out: bool = False, offset: int = 0):
    """{layer: (q, k, v)} (post-RoPE, float32, CPU; see `capture`) of n tokens of real text from token
    `offset` on (text_ids); the bundled SmolLM2 unless a model is given."""
    from ..models import load_model

    if model is None:
        model, tok = load_model(attn_implementation="sdpa")
    return capture(model, text_ids(tok, n, held_out, offset), layers)
