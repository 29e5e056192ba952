"""poison: a NaN output (and LSE) for non-finite inputs or malformed cu_seqlens, with no host synchronisation.

  poison_scan_kernel   grid (nq + 2·nk): nq = ceil(total_q·H·d / ELEMS) programs over q, then
                       nk = ceil(total_k·H_kv·d / ELEMS) over k and nk over v; a program sets flag = 1 if one of
                       its ELEMS elements is NaN or ±inf; program 0 also checks cu_seqlens and cu_seqlens_k (cu[0] = 0, cu[S] = total_q,
                       cu_k[S] = total_k, no negative step, no sequence with more queries than keys)
  poison_apply_kernel  grid (ceil(total_q·H·d / ELEMS)): while flag is set, fills its ELEMS elements of the output
                       with NaN, and of the LSE (total_q·H ≤ total_q·H·d elements) when write_lse ≠ 0
The flag (int32) is zeroed before the scan; the torch op and the plugin run both kernels.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import grid, kernel, or_unused, run


@triton.jit
def _nonfinite(x_ptr, off, numel):
    x = tl.load(x_ptr + off, mask=off < numel, other=0.0).to(tl.float32)
    return tl.max(((x != x) | (tl.abs(x) == float("inf"))).to(tl.int32), 0)


@triton.jit
def _bad_cu(cu_ptr, cu_k_ptr, seqs, total, total_k, ELEMS: tl.constexpr):
    bad = (tl.load(cu_ptr) != 0) | (tl.load(cu_ptr + seqs) != total)
    bad = bad | (tl.load(cu_k_ptr) != 0) | (tl.load(cu_k_ptr + seqs) != total_k)
    s0 = 0
    while s0 < seqs:
        i = s0 + tl.arange(0, ELEMS)
        a = tl.load(cu_ptr + i, mask=i < seqs, other=0)
        b = tl.load(cu_ptr + i + 1, mask=i < seqs, other=0)
        ka = tl.load(cu_k_ptr + i, mask=i < seqs, other=0)
        kb = tl.load(cu_k_ptr + i + 1, mask=i < seqs, other=0)
        bad = bad | (tl.max(((b < a) | (kb < ka) | (b - a > kb - ka)).to(tl.int32), 0) > 0)
        s0 += ELEMS
    return bad


@kernel
def poison_scan_kernel(q_ptr, k_ptr, v_ptr, cu_ptr, cu_k_ptr, flag_ptr, total, total_k, seqs, q_width, kv_width,
                       ELEMS: tl.constexpr):
    i = tl.program_id(0)
    q_numel = total.to(tl.int64) * q_width
    kv_numel = total_k.to(tl.int64) * kv_width
    nq = tl.cdiv(tl.maximum(q_numel, 1), ELEMS)
    nk = tl.cdiv(tl.maximum(kv_numel, 1), ELEMS)
    lane = tl.arange(0, ELEMS)
    if i < nq:
        bad = _nonfinite(q_ptr, i.to(tl.int64) * ELEMS + lane, q_numel)
        if i == 0:
            bad = bad | _bad_cu(cu_ptr, cu_k_ptr, seqs, total, total_k, ELEMS).to(tl.int32)
    elif i < nq + nk:
        bad = _nonfinite(k_ptr, (i - nq).to(tl.int64) * ELEMS + lane, kv_numel)
    else:
        bad = _nonfinite(v_ptr, (i - nq - nk).to(tl.int64) * ELEMS + lane, kv_numel)
    if bad != 0:
        tl.store(flag_ptr, 1)


@kernel
def poison_apply_kernel(o_ptr, lse_ptr, flag_ptr, total, width, write_lse, H, ELEMS: tl.constexpr):
    if tl.load(flag_ptr) != 0:
        off = tl.program_id(0).to(tl.int64) * ELEMS + tl.arange(0, ELEMS)
        nan = tl.full([ELEMS], float("nan"), tl.float32)
        tl.store(o_ptr + off, nan.to(o_ptr.dtype.element_ty), mask=off < total.to(tl.int64) * width)
        if write_lse != 0:
            tl.store(lse_ptr + off, nan, mask=off < total.to(tl.int64) * H)


def poison(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, cu_seqlens_k: torch.Tensor,
           out: torch.Tensor, lse: torch.Tensor | None, flag: torch.Tensor) -> torch.Tensor:
    """out (and lse, when given), filled with NaN iff an input is non-finite or a cu_seqlens table is malformed;
    flag: a zeroed int32 [1]."""
    total, heads, d = q.shape
    total_k, kv_heads = k.shape[:2]
    dims = dict(total=total, H=heads, D=d, total_k=total_k, HK=kv_heads)
    run(poison_scan_kernel, grid("poison_scan", **dims), q, k, v, cu_seqlens, cu_seqlens_k, flag, total, total_k,
        cu_seqlens.shape[0] - 1, heads * d, kv_heads * d, block=0)
    run(poison_apply_kernel, grid("poison_apply", **dims), out, or_unused(lse, q), flag,
        total, heads * d, int(lse is not None), heads, block=0)
    return out
