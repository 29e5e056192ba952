"""Argument checks for crisp_prefill_attention: every bad input raises naming the argument."""
from __future__ import annotations

import torch

from .config import CrispConfig

CUDA_DTYPES = (torch.float16, torch.bfloat16)
CUDA_HEAD_DIMS = (64, 128, 256)


def check_inputs(q, k, v, config, cu_seqlens, cu_seqlens_k=None) -> CrispConfig:
    """Validate q/k/v/config/cu_seqlens/cu_seqlens_k; returns the config to use. k and v may hold more positions
    than q (a chunked prefill: q is their last rows), never fewer."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if not t.dtype.is_floating_point:
            raise TypeError(f"{name}.dtype={t.dtype}: expected a floating dtype (float16, bfloat16, float32)")
    if config is None:
        config = CrispConfig()
    elif not isinstance(config, CrispConfig):
        raise TypeError(f"config: expected a CrispConfig or None, got {type(config).__name__}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"k.dtype={k.dtype}, v.dtype={v.dtype}: expected q's dtype {q.dtype}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"k.device={k.device}, v.device={v.device}: expected q's device {q.device}")
    if cu_seqlens_k is not None and cu_seqlens is None:
        raise ValueError("cu_seqlens_k: given without cu_seqlens; expected both (packed chunks: cu_seqlens the "
                         "query offsets, cu_seqlens_k the key offsets) or neither")
    rank = 3 if cu_seqlens is not None else q.dim()
    if rank not in (3, 4) or q.dim() != rank:
        expected = "[total, H, d] with cu_seqlens" if cu_seqlens is not None else "[B, n, H, d] or [n, H, d]"
        raise ValueError(f"q.shape={tuple(q.shape)}: expected rank {rank}, {expected}")
    for name, t in (("k", k), ("v", v)):
        if t.dim() != q.dim():
            raise ValueError(f"{name}.shape={tuple(t.shape)}: expected rank {q.dim()} like q")
        if t.shape[-1] != q.shape[-1]:
            raise ValueError(f"{name}.shape[-1]={t.shape[-1]}: expected q's head_dim {q.shape[-1]}")
    _check_lengths(q, k, cu_seqlens, cu_seqlens_k)
    if v.shape[:-2] != k.shape[:-2]:
        raise ValueError(f"v.shape={tuple(v.shape)}: expected k's batch/length dims {tuple(k.shape[:-2])}")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"v.shape[-2]={v.shape[-2]}: expected k's kv-head count {k.shape[-2]}")
    heads, kv_heads, dim = q.shape[-2], k.shape[-2], q.shape[-1]
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"q heads H={heads}, k heads H_kv={kv_heads}: expected H a multiple of H_kv")
    if q.is_cuda:
        if q.dtype not in CUDA_DTYPES:
            raise TypeError(f"q.dtype={q.dtype}: CUDA kernels expect float16 or bfloat16")
        if dim not in CUDA_HEAD_DIMS:
            raise ValueError(f"head_dim={dim}: CUDA kernels expect one of {CUDA_HEAD_DIMS}")
    elif not 1 <= dim <= 256:
        raise ValueError(f"head_dim={dim}: expected 1..256")
    if q.shape[-3] == 0:
        raise ValueError(f"q.shape={tuple(q.shape)}: expected at least one token")
    if cu_seqlens is not None:
        check_cu_seqlens(cu_seqlens, q.shape[0], q.device)
    if cu_seqlens_k is not None:
        check_cu_seqlens(cu_seqlens_k, k.shape[0], q.device, "cu_seqlens_k")
        if cu_seqlens_k.shape != cu_seqlens.shape:
            raise ValueError(f"cu_seqlens_k.shape={tuple(cu_seqlens_k.shape)}: expected cu_seqlens's "
                             f"{tuple(cu_seqlens.shape)} (one key range per query range)")
        if cu_seqlens.device.type == "cpu" and cu_seqlens_k.device.type == "cpu":
            cq, ck = cu_seqlens.tolist(), cu_seqlens_k.tolist()
            for s, (q_len, kv_len) in enumerate(zip(_steps(cq), _steps(ck))):
                if q_len > kv_len:
                    raise ValueError(f"cu_seqlens_k: sequence {s} has {kv_len} keys for {q_len} queries; expected "
                                     f"at least {q_len} (queries are the last positions of their sequence)")
    return config


def _steps(offsets: list[int]) -> list[int]:
    return [b - a for a, b in zip(offsets, offsets[1:])]


def _check_lengths(q, k, cu_seqlens, cu_seqlens_k) -> None:
    """k's batch/length dims against q's: the same batch, kv_len ≥ q_len; packed self-attention: the same total
    (packed chunks: cu_seqlens_k holds k's total, checked with its contents)."""
    if cu_seqlens is not None:
        if cu_seqlens_k is None and k.shape[0] != q.shape[0]:
            raise ValueError(f"k.shape={tuple(k.shape)}: expected q's token count {q.shape[0]} (or pass "
                             "cu_seqlens_k for keys that hold more positions than the queries)")
        return
    if q.dim() == 4 and k.shape[0] != q.shape[0]:
        raise ValueError(f"k.shape={tuple(k.shape)}: expected q's batch {q.shape[0]}")
    if k.shape[-3] < q.shape[-3]:
        raise ValueError(f"k.shape={tuple(k.shape)}: expected at least q's {q.shape[-3]} positions (kv_len ≥ q_len: "
                         "queries are the last q_len positions of the keys' sequence)")


def check_cu_seqlens(cu_seqlens, total: int, device: torch.device, name: str = "cu_seqlens") -> None:
    """Shape/dtype always; contents when on the CPU (on CUDA a bad table poisons the output with NaN)."""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"{name}: expected an int32 torch.Tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name}.dtype={cu_seqlens.dtype}: expected torch.int32 (or int64)")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"{name}.shape={tuple(cu_seqlens.shape)}: expected [num_seqs + 1] with num_seqs >= 1")
    if cu_seqlens.device.type != "cpu" and cu_seqlens.device != device:
        raise ValueError(f"{name}.device={cu_seqlens.device}: expected the CPU or q's device {device}")
    if cu_seqlens.device.type == "cpu":
        c = cu_seqlens.tolist()
        if c[0] != 0:
            raise ValueError(f"{name}[0]={c[0]}: expected 0")
        if c[-1] != total:
            raise ValueError(f"{name}[-1]={c[-1]}: expected the total token count {total}")
        if any(b < a for a, b in zip(c, c[1:])):
            raise ValueError(f"{name}={c}: expected non-decreasing offsets")
