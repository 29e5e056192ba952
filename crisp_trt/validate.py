"""Argument checks for crisp_prefill_attention: every bad input raises naming the argument."""
from __future__ import annotations

import torch

from .config import CrispConfig

CUDA_DTYPES = (torch.float16, torch.bfloat16)
CUDA_HEAD_DIMS = (64, 128, 256)


def check_inputs(q, k, v, config, cu_seqlens) -> CrispConfig:
    """Validate q/k/v/config/cu_seqlens; returns the config to use."""
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
    rank = 3 if cu_seqlens is not None else q.dim()
    if rank not in (3, 4) or q.dim() != rank:
        expected = "[total, H, d] with cu_seqlens" if cu_seqlens is not None else "[B, n, H, d] or [n, H, d]"
        raise ValueError(f"q.shape={tuple(q.shape)}: expected rank {rank}, {expected}")
    for name, t in (("k", k), ("v", v)):
        if t.dim() != q.dim():
            raise ValueError(f"{name}.shape={tuple(t.shape)}: expected rank {q.dim()} like q")
        if t.shape[:-2] != q.shape[:-2]:
            raise ValueError(f"{name}.shape={tuple(t.shape)}: expected the same batch/length dims as "
                             f"q {tuple(q.shape[:-2])}")
        if t.shape[-1] != q.shape[-1]:
            raise ValueError(f"{name}.shape[-1]={t.shape[-1]}: expected q's head_dim {q.shape[-1]}")
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
    return config


def check_cu_seqlens(cu_seqlens, total: int, device: torch.device) -> None:
    """Shape/dtype always; contents when on the CPU (on CUDA a bad table poisons the output with NaN)."""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"cu_seqlens: expected an int32 torch.Tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"cu_seqlens.dtype={cu_seqlens.dtype}: expected torch.int32 (or int64)")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens.shape={tuple(cu_seqlens.shape)}: expected [num_seqs + 1] with num_seqs >= 1")
    if cu_seqlens.device.type != "cpu" and cu_seqlens.device != device:
        raise ValueError(f"cu_seqlens.device={cu_seqlens.device}: expected the CPU or q's device {device}")
    if cu_seqlens.device.type == "cpu":
        c = cu_seqlens.tolist()
        if c[0] != 0:
            raise ValueError(f"cu_seqlens[0]={c[0]}: expected 0")
        if c[-1] != total:
            raise ValueError(f"cu_seqlens[-1]={c[-1]}: expected the total token count {total}")
        if any(b < a for a, b in zip(c, c[1:])):
            raise ValueError(f"cu_seqlens={c}: expected non-decreasing offsets")
