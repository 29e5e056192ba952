"""pool: per-block means of q and k (fp32), the proxy behind block-sparse rows and JSD routing.

Grid (NB, H + H_kv, S): program (b, j, s) averages block b of sequence s for q head j (j < H) or
k head j − H into pooled_q [S, NB, H, d] / pooled_k [S, NB, H_kv, d] (f32; the keys also into pooled_k_in in
q's dtype, spike's dot operands); blocks are absolute, and a chunk's query block pools the chunk's rows in it
(none before the chunk; the first one may be partial), each block divided by the rows it has
(reference.pool_blocks).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .bounds import chunk_bounds
from .launch import kernel


@triton.jit
def _pool_head(src, dst, dst_in, start, first, n, b, s, head, HEADS, NB, BLOCK: tl.constexpr, D: tl.constexpr):
    """Mean of positions [first, n) ∩ block b, position p read from row start + p − first of src; unless dst_in
    is None also rounded to its dtype."""
    tok = b * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, D)
    x = tl.load(src + ((start - first + tok).to(tl.int64) * HEADS + head)[:, None] * D + cols[None, :],
                mask=((tok >= first) & (tok < n))[:, None], other=0.0)
    rows = tl.minimum(n, b * BLOCK + BLOCK) - tl.maximum(first, b * BLOCK)
    mean = tl.sum(x.to(tl.float32), 0) / rows.to(tl.float32)
    at = ((s * NB + b).to(tl.int64) * HEADS + head) * D + cols
    tl.store(dst + at, mean)
    if dst_in is not None:
        tl.store(dst_in + at, mean.to(dst_in.dtype.element_ty))


@kernel
def pool_kernel(q_ptr, k_ptr, cu_ptr, cu_k_ptr, pq_ptr, pk_ptr, pk_in_ptr, dense_below, total, total_k, H, HK,
                NB, BLOCK: tl.constexpr, D: tl.constexpr):
    b = tl.program_id(0)
    j = tl.program_id(1)
    s = tl.program_id(2)
    q_start, q_len, k_start, n = chunk_bounds(cu_ptr, cu_k_ptr, s, total, total_k, NB * BLOCK)
    if (n < dense_below) | (b * BLOCK >= n):
        return
    if j < H:
        if b * BLOCK + BLOCK > n - q_len:  # a query block the chunk touches
            _pool_head(q_ptr, pq_ptr, None, q_start, n - q_len, n, b, s, j, H, NB, BLOCK, D)
    else:
        _pool_head(k_ptr, pk_ptr, pk_in_ptr, k_start, 0, n, b, s, j - H, HK, NB, BLOCK, D)
