"""pool: per-block means of q and k (fp32), the proxy behind block-sparse rows and JSD routing.

Grid (NB, H + H_kv, S): program (b, j, s) averages block b of sequence s for q head j (j < H) or
k head j − H into pooled_q [S, NB, H, d] / pooled_k [S, NB, H_kv, d]; the last block is divided by
its true width (reference.pool_blocks).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .bounds import seq_bounds
from .launch import kernel


@triton.jit
def _pool_head(src, dst, start, n, b, s, head, HEADS, NB, BLOCK: tl.constexpr, D: tl.constexpr):
    tok = b * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, D)
    x = tl.load(src + ((start + tok).to(tl.int64) * HEADS + head)[:, None] * D + cols[None, :],
                mask=(tok < n)[:, None], other=0.0)
    mean = tl.sum(x.to(tl.float32), 0) / tl.minimum(n - b * BLOCK, BLOCK).to(tl.float32)
    tl.store(dst + ((s * NB + b).to(tl.int64) * HEADS + head) * D + cols, mean)


@kernel
def pool_kernel(q_ptr, k_ptr, cu_ptr, pq_ptr, pk_ptr, dense_below, total, H, HK, NB, BLOCK: tl.constexpr,
                D: tl.constexpr):
    b = tl.program_id(0)
    j = tl.program_id(1)
    s = tl.program_id(2)
    start, n = seq_bounds(cu_ptr, s, total, NB * BLOCK)
    if (n < dense_below) | (b * BLOCK >= n):
        return
    if j < H:
        _pool_head(q_ptr, pq_ptr, start, n, b, s, j, H, NB, BLOCK, D)
    else:
        _pool_head(k_ptr, pk_ptr, start, n, b, s, j - H, HK, NB, BLOCK, D)
