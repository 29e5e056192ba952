"""HF transformers integration: `attn_implementation="crisp"` (docs/design.md, "Interfaces").

`register()` (run on import of this module) adds "crisp" to transformers' `AttentionInterface` and
`crisp_mask` (SDPA's mask builder, plus None for a plain chunked causal mask) to `AttentionMaskInterface` under
the same name, so

    import crisp_trt.hf
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="crisp")

routes every attention layer through `crisp_attention_forward`:

* prefill — query length == key length, or a chunk (1 < query length < key length: a prompt fed in chunks
  through a cache, the queries the last positions of the keys), key length ≥ max(dense_below, 1), no
  attention mask (no padding: `crisp_mask` returns None for a plain causal batch, chunked or not), default
  scaling 1/√d, no dropout, no sliding window → `crisp_prefill_attention` (CPU: reference, CUDA: Triton
  kernels);
* everything else (decode with a KV cache, short prompts, padded batches, static caches, sliding-window
  layers: Mistral/Qwen2 `use_sliding_window`, Gemma-2/3 `layer_types`) → transformers' own
  `sdpa_attention_forward`, i.e. dense (a chunk that goes dense gets its bottom-right causal mask back).
  Logit soft-capping (Gemma-2) has no SDPA path: a clear error.

The CrispConfig is per model or per layer: `set_crisp_config(model, cfg)` stores `cfg.to_dict()` (or,
for a list of configs, one dict per layer: a crisp-build artifact's calibrated kappa/tau) in
`model.config.crisp_config`, so it also survives `save_pretrained`; each attention module reads it from
`module.config.crisp_config` (attention modules keep a reference to the model config) and, for a list,
takes entry `module.layer_idx`. Without one, `CrispConfig()` defaults are used. `crisp_config_of(model,
layer)` reads it back. `set_cuda_graphs(model, True)` (model.config.crisp_cuda_graphs) sends CUDA prefills
through crisp_trt.graphs (a graph per shape and config: no per-call host work). Per-call counters
(`CALLS["crisp"]`, `CALLS["dense"]`) let tests and benchmarks see which path ran. This is the only place that registers CRISP with transformers (crisp_trt.runtime
uses it too).
"""
from __future__ import annotations

import math
from collections import Counter

import torch

from .api import bottom_right_causal, crisp_prefill_attention
from .config import CrispConfig
from .graphs import graphed_prefill_attention

NAME = "crisp"
CALLS: Counter = Counter()
_CACHE: dict = {}


def _config_from(obj, layer: int = 0) -> CrispConfig:
    raw = getattr(obj, "crisp_config", None) if obj is not None else None
    if isinstance(raw, (list, tuple)):
        raw = raw[layer % len(raw)]
    if raw is None:
        return CrispConfig()
    if isinstance(raw, CrispConfig):
        return raw
    key = tuple(sorted(raw.items()))
    if key not in _CACHE:
        _CACHE[key] = CrispConfig.from_dict(dict(raw))
    return _CACHE[key]


def _as_dict(cfg: CrispConfig | dict) -> dict:
    return (cfg if isinstance(cfg, CrispConfig) else CrispConfig.from_dict(cfg)).to_dict()


def _lm_configs(model) -> list:
    """The model's config and, for multimodal wrappers, the LM's own (text_config)."""
    return [model.config] + [getattr(model.config, sub) for sub in ("text_config",) if hasattr(model.config, sub)]


def set_cuda_graphs(model, enabled: bool) -> None:
    """CUDA prefills of `model` through crisp_trt.graphs (a graph per shape and config) or the op itself."""
    if not isinstance(enabled, bool):
        raise ValueError(f"enabled={enabled!r}: expected True or False")
    for c in _lm_configs(model):
        c.crisp_cuda_graphs = enabled


def set_crisp_config(model, cfg: CrispConfig | dict | list | None) -> None:
    """Attach a CrispConfig (or one per layer) to a model as dicts in model.config.crisp_config;
    None → defaults."""
    if cfg is None:
        raw = None
    elif isinstance(cfg, (list, tuple)):
        raw = [_as_dict(c) for c in cfg]
    else:
        raw = _as_dict(cfg)
    for c in _lm_configs(model):
        c.crisp_config = raw


def crisp_config_of(model, layer: int = 0) -> CrispConfig:
    return _config_from(model.config, layer)


def crisp_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                            is_causal: bool | None = None, **kwargs):
    """Same contract as transformers' sdpa_attention_forward: query [B, H, q, d], key/value [B, H_kv, k, d];
    returns (attn_output [B, q, H, d], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if kwargs.get("softcap") is not None:
        raise ValueError(f"attn_implementation='crisp': softcap={kwargs['softcap']} (attention logit soft-capping, "
                         "Gemma-2's attn_logit_softcapping) is not supported by CRISP or SDPA; load the model with "
                         "attn_implementation='eager' or set config.attn_logit_softcapping=None")
    cfg = _config_from(getattr(module, "config", None), getattr(module, "layer_idx", 0) or 0)
    q_len, k_len, d = query.shape[2], key.shape[2], query.shape[-1]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    default_scale = scaling is None or math.isclose(scaling, d ** -0.5, rel_tol=1e-6)
    plain = attention_mask is None and causal  # crisp_mask: no padding, the queries the keys' last positions
    chunk = plain and 1 < q_len < k_len
    prefill = (plain and (q_len == k_len or chunk) and k_len >= max(cfg.dense_below, 1) and default_scale
               and (dropout == 0.0 or not module.training) and kwargs.get("sliding_window") is None
               and query.shape[1] % key.shape[1] == 0)
    if not prefill:
        CALLS["dense"] += 1
        if chunk:  # SDPA's is_causal is top-left: give a dense chunk its bottom-right mask
            attention_mask = bottom_right_causal(q_len, k_len, query.device)
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    CALLS["crisp"] += 1
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # [B, n, H, d]
    graphs = getattr(getattr(module, "config", None), "crisp_cuda_graphs", False)
    out = (graphed_prefill_attention if graphs else crisp_prefill_attention)(q, k, v, config=cfg)
    return out, None


def crisp_mask(**kwargs):
    """transformers' sdpa_mask (same keyword arguments), except None for a chunked prefill's plain causal mask:
    1 < q_length < kv_length queries at the last positions of the keys (q_offset + q_length = kv_offset +
    kv_length, as a DynamicCache gives), the plain causal mask function, no local window, no padding.
    crisp_attention_forward then runs the chunk through CRISP, or rebuilds the mask where it goes dense.
    sdpa_mask itself returns None only for q_length == kv_length or 1 (SDPA's is_causal aligns top-left).
    transformers before 5.x passes no q_length / q_offset: sdpa_mask's behaviour, unchanged."""
    from transformers.masking_utils import causal_mask_function, fast_all, prepare_padding_mask, sdpa_mask

    q_len, kv_len = kwargs.get("q_length"), kwargs.get("kv_length")
    q_offset, kv_offset = kwargs.get("q_offset"), kwargs.get("kv_offset", 0)
    if (kwargs.get("allow_is_causal_skip", True) and kwargs.get("mask_function", causal_mask_function)
            is causal_mask_function and kwargs.get("local_size") is None and isinstance(q_len, int)
            and isinstance(q_offset, int) and 1 < q_len < kv_len and q_offset + q_len == kv_offset + kv_len):
        padding = prepare_padding_mask(kwargs.get("attention_mask"), kv_len, kv_offset)
        if padding is None or fast_all(padding):
            return None
    return sdpa_mask(**kwargs)


def register() -> None:
    """Register "crisp" with transformers' AttentionInterface and AttentionMaskInterface (idempotent)."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("crisp_trt.hf needs transformers>=4.57: pip install -e .[eval] "
                          "(or pip install transformers)") from exc
    AttentionInterface.register(NAME, crisp_attention_forward)
    AttentionMaskInterface.register(NAME, crisp_mask)


register()
