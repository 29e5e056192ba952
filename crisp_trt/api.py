"""crisp_prefill_attention: the public op, a torch custom op (`crisp::prefill_attention`).

CPU tensors run the pure-PyTorch reference; CUDA tensors run the Triton kernels with no host
synchronisation, so the op composes with torch.compile and CUDA graph capture.
"""
from __future__ import annotations

import functools
import json

import torch

from . import reference
from .config import CrispConfig
from .stats import CrispStats
from .validate import check_inputs


@torch.library.custom_op("crisp::prefill_attention", mutates_args=())
def _prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                       max_seqlen: int, config: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    cfg = _config_of(config)
    if q.is_cuda:
        from .kernels.pipeline import crisp_cuda

        return crisp_cuda(q, k, v, cu_seqlens, max_seqlen, cfg)
    return _reference_packed(q, k, v, cu_seqlens, cfg)


@functools.lru_cache(maxsize=256)
def _config_json(cfg: CrispConfig) -> str:
    """The op's config argument (a string: custom ops take no dataclasses); cached, as is its parse, since
    every layer of every prefill passes one (asdict + validation cost ~50 µs of host time per call)."""
    return json.dumps(cfg.to_dict(), sort_keys=True)


@functools.lru_cache(maxsize=256)
def _config_of(config: str) -> CrispConfig:
    return CrispConfig.from_dict(json.loads(config))


@_prefill_attention.register_fake
def _(q, k, v, cu_seqlens, max_seqlen, config):
    seqs, heads = cu_seqlens.shape[0] - 1, q.shape[1]
    stat = q.new_empty((seqs, heads), dtype=torch.float32)
    return torch.empty_like(q), q.new_empty((seqs, heads), dtype=torch.int32), stat, torch.empty_like(stat)


def _reference_packed(q, k, v, cu_seqlens, cfg):
    bounds = cu_seqlens.tolist()
    out = torch.empty_like(q)
    routes, structs, densities = [], [], []
    for start, end in zip(bounds, bounds[1:]):
        if end == start:
            routes.append(torch.zeros(q.shape[1], dtype=torch.int32))
            structs.append(torch.zeros(q.shape[1]))
            densities.append(torch.zeros(q.shape[1]))
            continue
        o, r, c, d = reference.crisp_sequence(q[start:end], k[start:end], v[start:end], cfg)
        out[start:end] = o
        routes.append(r.int())
        structs.append(c.float())
        densities.append(d.float())
    if not all(bool(torch.isfinite(t).all()) for t in (q, k, v)):
        out.fill_(float("nan"))  # a non-finite input must never give a finite answer
    return out, torch.stack(routes), torch.stack(structs), torch.stack(densities)


def crisp_prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, config: CrispConfig | None = None,
                            cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None,
                            return_stats: bool = False):
    """Causal CRISP sparse prefill attention.

    Layouts: q [B, n, H, d] with k, v [B, n, H_kv, d]; or packed q [total, H, d], k, v [total, H_kv, d]
    with `cu_seqlens` int32 [num_seqs + 1] (offsets, cu_seqlens[0] = 0, cu_seqlens[-1] = total);
    a rank-3 q without cu_seqlens is one sequence. H must be a multiple of H_kv (GQA by indexing).
    `max_seqlen` (optional, packed only) bounds workspace sizes; without it the total is used.
    Returns the attention in q's layout and dtype, plus a CrispStats (route, C_struct, density per
    sequence and head) when return_stats=True. NaN/Inf anywhere in q, k, v gives a NaN output.
    """
    cfg = check_inputs(q, k, v, config, cu_seqlens)
    shape = q.shape
    if cu_seqlens is None:
        if q.dim() == 4:
            batch, n = shape[0], shape[1]
            q, k, v = (t.reshape(batch * n, *t.shape[2:]) for t in (q, k, v))
        else:
            batch, n = 1, shape[0]
        cu = torch.arange(0, (batch + 1) * n, n, device=q.device, dtype=torch.int32)
        max_len = n
    else:
        cu = cu_seqlens.to(device=q.device, dtype=torch.int32)
        if max_seqlen is not None and (not isinstance(max_seqlen, int) or max_seqlen < 1):
            raise ValueError(f"max_seqlen={max_seqlen!r}: expected a positive int or None")
        if cu_seqlens.device.type == "cpu":
            bounds = cu_seqlens.tolist()
            max_len = max(b - a for a, b in zip(bounds, bounds[1:]))
        else:
            max_len = max_seqlen or q.shape[0]
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out, route, c_struct, dens = _prefill_attention(q, k, v, cu, max(int(max_len), 1), _config_json(cfg))
    out = out.reshape(shape)
    return (out, CrispStats(route, c_struct, dens)) if return_stats else out


def dense_prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal dense attention in the same layouts ([B, n, H, d] or [n, H, d]); the accuracy baseline."""
    if q.dim() == 3:
        return reference.dense_attention(q, k, v) if not q.is_cuda else _sdpa(q[None], k[None], v[None])[0]
    if not q.is_cuda:
        return torch.stack([reference.dense_attention(a, b, c) for a, b, c in zip(q, k, v)])
    return _sdpa(q, k, v)


def _sdpa(q, k, v):
    groups = q.shape[2] // k.shape[2]
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=groups > 1)
    return out.transpose(1, 2)
