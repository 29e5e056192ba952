"""poison: a NaN output for non-finite inputs or a malformed cu_seqlens, with no host synchronisation.

  poison_scan_kernel   grid (ceil(total·H·d / ELEMS), 3): program (i, t) sets flag = 1 if one of the ELEMS
                       elements i·ELEMS.. of q (t = 0), k (1) or v (2) is NaN or ±inf; program (0, 0) also
                       checks cu_seqlens (cu[0] = 0, cu[S] = total, no negative step)
  poison_apply_kernel  same x grid: while flag is set, fills its ELEMS elements of the output with NaN
The flag (int32) is zeroed before the scan; the torch op and the plugin run both kernels.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import POISON_ELEMS, kernel, run


@triton.jit
def _nonfinite(x_ptr, off, numel):
    x = tl.load(x_ptr + off, mask=off < numel, other=0.0).to(tl.float32)
    return tl.max(((x != x) | (tl.abs(x) == float("inf"))).to(tl.int32), 0)


@triton.jit
def _bad_cu(cu_ptr, seqs, total, ELEMS: tl.constexpr):
    bad = (tl.load(cu_ptr) != 0) | (tl.load(cu_ptr + seqs) != total)
    s0 = 0
    while s0 < seqs:
        i = s0 + tl.arange(0, ELEMS)
        a = tl.load(cu_ptr + i, mask=i < seqs, other=0)
        b = tl.load(cu_ptr + i + 1, mask=i < seqs, other=0)
        bad = bad | (tl.max((b < a).to(tl.int32), 0) > 0)
        s0 += ELEMS
    return bad


@kernel
def poison_scan_kernel(q_ptr, k_ptr, v_ptr, cu_ptr, flag_ptr, total, seqs, q_width, kv_width, ELEMS: tl.constexpr):
    i = tl.program_id(0)
    t = tl.program_id(1)
    off = i.to(tl.int64) * ELEMS + tl.arange(0, ELEMS)
    if t == 0:
        bad = _nonfinite(q_ptr, off, total.to(tl.int64) * q_width)
        if i == 0:
            bad = bad | _bad_cu(cu_ptr, seqs, total, ELEMS).to(tl.int32)
    elif t == 1:
        bad = _nonfinite(k_ptr, off, total.to(tl.int64) * kv_width)
    else:
        bad = _nonfinite(v_ptr, off, total.to(tl.int64) * kv_width)
    if bad != 0:
        tl.store(flag_ptr, 1)


@kernel
def poison_apply_kernel(o_ptr, flag_ptr, total, width, ELEMS: tl.constexpr):
    if tl.load(flag_ptr) != 0:
        off = tl.program_id(0).to(tl.int64) * ELEMS + tl.arange(0, ELEMS)
        nan = tl.full([ELEMS], float("nan"), tl.float32).to(o_ptr.dtype.element_ty)
        tl.store(o_ptr + off, nan, mask=off < total.to(tl.int64) * width)


def poison(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, out: torch.Tensor,
           flag: torch.Tensor) -> torch.Tensor:
    """out, filled with NaN iff an input is non-finite or cu_seqlens is malformed; flag: a zeroed int32 [1]."""
    total, heads, d = q.shape
    grid = triton.cdiv(max(total * heads * d, 1), POISON_ELEMS)
    run(poison_scan_kernel, (grid, 3), q, k, v, cu_seqlens, flag, total, cu_seqlens.shape[0] - 1, heads * d,
        k.shape[1] * d, block=0)
    run(poison_apply_kernel, (grid,), out, flag, total, heads * d, block=0)
    return out
