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
                       cu_seqlens_k: torch.Tensor, max_seqlen: int, config: str, return_lse: bool,
                       return_stats: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, lse [total_q, H] or [0], route, c_struct, density [S, H] or each [0] without return_stats: the
    kernels then skip the density's small kernels); max_seqlen bounds the kv lengths."""
    cfg = _config_of(config)
    if q.is_cuda:
        from .kernels.pipeline import crisp_cuda

        return crisp_cuda(q, k, v, cu_seqlens, max_seqlen, cfg, cu_seqlens_k=cu_seqlens_k, return_lse=return_lse,
                          return_stats=return_stats)
    out, lse, *stats = _reference_packed(q, k, v, cu_seqlens, cu_seqlens_k, cfg, return_lse)
    return (out, lse, *(stats if return_stats else (t.new_empty(0) for t in stats)))


@functools.lru_cache(maxsize=256)
def _config_json(cfg: CrispConfig) -> str:
    """The op's config argument (a string: custom ops take no dataclasses); cached, as is its parse, since
    every layer of every prefill passes one (asdict + validation cost ~50 µs of host time per call)."""
    return json.dumps(cfg.to_dict(), sort_keys=True)


@functools.lru_cache(maxsize=256)
def _config_of(config: str) -> CrispConfig:
    return CrispConfig.from_dict(json.loads(config))


@_prefill_attention.register_fake
def _(q, k, v, cu_seqlens, cu_seqlens_k, max_seqlen, config, return_lse, return_stats):
    heads = q.shape[1]
    per_head = (cu_seqlens.shape[0] - 1, heads) if return_stats else (0,)
    stat = q.new_empty(per_head, dtype=torch.float32)
    lse = q.new_empty((q.shape[0], heads) if return_lse else (0,), dtype=torch.float32)
    return torch.empty_like(q), lse, q.new_empty(per_head, dtype=torch.int32), stat, torch.empty_like(stat)


def _reference_packed(q, k, v, cu_seqlens, cu_seqlens_k, cfg, return_lse):
    q_bounds, k_bounds = cu_seqlens.tolist(), cu_seqlens_k.tolist()
    out = torch.empty_like(q)
    lse = torch.empty((q.shape[0], q.shape[1]) if return_lse else (0,), dtype=torch.float32)
    routes, structs, densities = [], [], []
    for qa, qb, ka, kb in zip(q_bounds, q_bounds[1:], k_bounds, k_bounds[1:]):
        if qb == qa:  # no queries: nothing attended
            routes.append(torch.zeros(q.shape[1], dtype=torch.int32))
            structs.append(torch.zeros(q.shape[1]))
            densities.append(torch.zeros(q.shape[1]))
            continue
        o, r, c, d, *rows_lse = reference.crisp_sequence(q[qa:qb], k[ka:kb], v[ka:kb], cfg, return_lse=return_lse)
        out[qa:qb] = o
        if return_lse:
            lse[qa:qb] = rows_lse[0]
        routes.append(r.int())
        structs.append(c.float())
        densities.append(d.float())
    if not all(bool(torch.isfinite(t).all()) for t in (q, k, v)):
        out.fill_(float("nan"))  # a non-finite input must never give a finite answer
        lse.fill_(float("nan"))
    return out, lse, torch.stack(routes), torch.stack(structs), torch.stack(densities)


def crisp_prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, config: CrispConfig | None = None,
                            cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None,
                            cu_seqlens_k: torch.Tensor | None = None, max_seqlen_k: int | None = None,
                            return_stats: bool = False, return_lse: bool = False):
    """Causal CRISP sparse prefill attention, whole prompts or chunks of them.

    Layouts: q [B, q_len, H, d] with k, v [B, kv_len, H_kv, d]; or a rank-3 q [q_len, H, d] with k, v
    [kv_len, H_kv, d] (one sequence); or packed q [total, H, d], k, v [total, H_kv, d] with `cu_seqlens` int32
    [num_seqs + 1] (offsets, cu_seqlens[0] = 0, cu_seqlens[-1] = total); or packed chunks: q [total_q, H, d] with
    `cu_seqlens` (query offsets) and k, v [total_k, H_kv, d] with `cu_seqlens_k` (key offsets, the same
    number of sequences). H must be a multiple of H_kv (GQA by indexing).

    Chunked prefill: a sequence's queries are the LAST q_len ≤ kv_len positions of its kv_len keys (query i sits at
    position kv_len − q_len + i and attends keys ≤ that position), so a prompt fed in chunks, each chunk's q with
    all keys so far, gives the one-call rows (exactly the one call's plan when q_len ≥ the window and the chunk
    starts on a block boundary; docs/design.md, "Chunked prefill and LSE"). q_len == kv_len is a whole prompt.
    `max_seqlen` (packed, no cu_seqlens_k) or `max_seqlen_k` (with cu_seqlens_k) bounds the sequences' kv lengths
    for workspace sizes on CUDA; without it the total is used.

    Returns the attention in q's layout and dtype; with return_lse=True also the log-sum-exp (natural log, f32)
    of the scaled logits over the keys each row attended, shaped like q without its last axis ([B, q_len, H] or
    [total_q, H]). Two results over disjoint key sets merge into the one over their union:
    lse = logaddexp(lse_a, lse_b), out = exp(lse_a − lse)·out_a + exp(lse_b − lse)·out_b
    (reference.merge_partials). With return_stats=True also a CrispStats (route, C_struct, density per sequence
    and head): returns (out, lse, stats) with both. NaN/Inf anywhere in q, k, v gives a NaN output (and LSE).
    """
    cfg = check_inputs(q, k, v, config, cu_seqlens, cu_seqlens_k)
    if cu_seqlens_k is None and max_seqlen_k is not None:
        raise ValueError(f"max_seqlen_k={max_seqlen_k!r}: given without cu_seqlens_k; expected None (pass max_seqlen)")
    if cu_seqlens_k is not None and max_seqlen is not None:
        raise ValueError(f"max_seqlen={max_seqlen!r}: with cu_seqlens_k the workspace follows the kv lengths; "
                         "expected None (pass max_seqlen_k)")
    shape = q.shape
    if cu_seqlens is None:
        batch, q_len, kv_len = (shape[0], shape[1], k.shape[1]) if q.dim() == 4 else (1, shape[0], k.shape[0])
        q, k, v = (t.reshape(-1, *t.shape[-2:]) for t in (q, k, v))
        cu = torch.arange(0, (batch + 1) * q_len, q_len, device=q.device, dtype=torch.int32)
        cu_k = cu if kv_len == q_len else torch.arange(0, (batch + 1) * kv_len, kv_len, device=q.device,
                                                       dtype=torch.int32)
        max_len = kv_len
    else:
        cu = cu_seqlens.to(device=q.device, dtype=torch.int32)
        if cu_seqlens_k is None:  # the keys' table and bound: the queries' own, or the chunks' key ones
            keys, cu_k, name, bound = cu_seqlens, cu, "max_seqlen", max_seqlen
        else:
            keys, name, bound = cu_seqlens_k, "max_seqlen_k", max_seqlen_k
            cu_k = cu_seqlens_k.to(device=q.device, dtype=torch.int32)
        if bound is not None and (not isinstance(bound, int) or bound < 1):
            raise ValueError(f"{name}={bound!r}: expected a positive int or None")
        if keys.device.type == "cpu":
            bounds = keys.tolist()
            max_len = max(b - a for a, b in zip(bounds, bounds[1:]))
        else:
            max_len = bound or k.shape[0]
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out, lse, route, c_struct, dens = _prefill_attention(q, k, v, cu, cu_k, max(int(max_len), 1), _config_json(cfg),
                                                         return_lse, return_stats)
    result = (out.reshape(shape),)
    if return_lse:
        result += (lse.reshape(shape[:-1]),)
    if return_stats:
        result += (CrispStats(route, c_struct, dens),)
    return result if len(result) > 1 else result[0]


def dense_prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal dense attention in the same layouts ([B, n, H, d] or [n, H, d]; k, v may hold more positions than
    q, whose rows are then the last ones); the accuracy baseline."""
    if q.dim() == 3:
        return reference.dense_attention(q, k, v) if not q.is_cuda else _sdpa(q[None], k[None], v[None])[0]
    if not q.is_cuda:
        return torch.stack([reference.dense_attention(a, b, c) for a, b, c in zip(q, k, v)])
    return _sdpa(q, k, v)


def bottom_right_causal(q_len: int, kv_len: int, device) -> torch.Tensor | None:
    """SDPA's boolean mask for q_len queries at the last positions of kv_len keys (None when q_len == kv_len:
    is_causal then means the same, and SDPA's top-left is_causal is wrong for q_len < kv_len)."""
    if q_len == kv_len:
        return None
    return torch.ones(q_len, kv_len, dtype=torch.bool, device=device).tril(kv_len - q_len)


def _sdpa(q, k, v):
    groups = q.shape[2] // k.shape[2]
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    mask = bottom_right_causal(q.shape[1], k.shape[1], q.device)
    out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, is_causal=mask is None,
                                                           enable_gqa=groups > 1)
    return out.transpose(1, 2)
