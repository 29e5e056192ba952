"""The rows stage in two passes, the reference point rows_variants.py times the one-pass kernel against.

Each sampled row's max and Σexp2 in pass 1, each key block's share in pass 2: every key read and exponentiated
twice. Grid (cdiv(NB · R, RM), H, S), the latest tiles first.
"""
from __future__ import annotations

import triton
import triton.language as tl

from crisp_trt.kernels.bounds import chunk_bounds
from crisp_trt.kernels.launch import kernel
from crisp_trt.kernels.rows import _logits


@triton.jit
def _row_stats(m, l, q, k_ptr, k_start, lo, hi, pos, last, qk_scale, hk, HK, BLOCK: tl.constexpr,
               D: tl.constexpr, MASKED: tl.constexpr):
    """Pass 1 over key blocks [lo, hi): each row's running max and Σexp2."""
    for kb in range(lo, hi):
        x = _logits(q, k_ptr, k_start, kb, pos, last, qk_scale, hk, HK, BLOCK, D, MASKED)
        m_new = tl.maximum(m, tl.max(x, 1))
        l = l * tl.exp2(m - m_new) + tl.sum(tl.exp2(x - m_new[:, None]), 1)
        m = m_new
    return m, l


@triton.jit
def _block_mass(out, ok, blocks, q, k_ptr, k_start, lo, hi, pos, last, m, inv, qk_scale, hk, HK,
                BLOCK: tl.constexpr, D: tl.constexpr, R: tl.constexpr, RM: tl.constexpr, MASKED: tl.constexpr):
    """Pass 2 over key blocks [lo, hi): each block's probability, summed over its keys, times inv (1 / (R Σexp2)),
    summed over each query block's rows into out[qb, kb] (causal blocks only)."""
    for kb in range(lo, hi):
        x = _logits(q, k_ptr, k_start, kb, pos, last, qk_scale, hk, HK, BLOCK, D, MASKED)
        per_row = tl.sum(tl.exp2(x - m[:, None]), 1) * inv
        tl.store(out + kb, tl.sum(tl.reshape(per_row, (RM // R, R)), 1), mask=ok & (kb <= blocks))


@kernel
def rows_twopass_kernel(q_ptr, k_ptr, cu_ptr, cu_k_ptr, route_ptr, scratch_ptr, sm_scale, dense_below, total,
                        total_k, H, G, NB, BLOCK: tl.constexpr, D: tl.constexpr, R: tl.constexpr, RM: tl.constexpr):
    g = tl.num_programs(0) - 1 - tl.program_id(0)  # the latest query blocks (the most keys) first
    h = tl.program_id(1)
    s = tl.program_id(2)
    q_start, q_len, k_start, n = chunk_bounds(cu_ptr, cu_k_ptr, s, total, total_k, NB * BLOCK)
    first = n - q_len
    qb_lo = g * (RM // R)
    if (n < dense_below) | (qb_lo * BLOCK >= n) | ((qb_lo + RM // R) * BLOCK <= first):
        return
    if tl.load(route_ptr + s * H + h) != 2:
        return
    t = tl.arange(0, RM)
    qb = qb_lo + t // R  # each row's query block
    pos = tl.minimum(tl.maximum(qb * BLOCK + (BLOCK // R) * (t % R + 1) - 1, first), n - 1)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + ((q_start - first + pos).to(tl.int64) * H + h)[:, None] * D + d[None, :])
    qk_scale = sm_scale * 1.4426950408889634
    hk, HK = h // G, H // G
    last = tl.max(pos, 0)
    top = last // BLOCK + 1  # key blocks [0, qb_lo) precede every row; [qb_lo, top) need the causal mask
    m, l = _row_stats(tl.full([RM], float("-inf"), tl.float32), tl.zeros([RM], tl.float32), q, k_ptr, k_start, 0,
                      qb_lo, pos, last, qk_scale, hk, HK, BLOCK, D, False)
    m, l = _row_stats(m, l, q, k_ptr, k_start, qb_lo, top, pos, last, qk_scale, hk, HK, BLOCK, D, True)
    inv = 1.0 / (l * R)  # every row has its own key: l ≥ 1
    blocks = qb_lo + tl.arange(0, RM // R)
    ok = (blocks * BLOCK < n) & (blocks * BLOCK + BLOCK > first)
    out = scratch_ptr + ((s * H + h).to(tl.int64) * NB + blocks) * NB
    _block_mass(out, ok, blocks, q, k_ptr, k_start, 0, qb_lo, pos, last, m, inv, qk_scale, hk, HK, BLOCK, D, R, RM,
                False)
    _block_mass(out, ok, blocks, q, k_ptr, k_start, qb_lo, top, pos, last, m, inv, qk_scale, hk, HK, BLOCK, D, R, RM,
                True)


def launch(q, k, cu, route, scratch, sm_scale, dense_below, nb, heads, groups, block, d, r, rm, **options):
    """One launch over one packed batch of whole prompts (cu_seqlens for queries and keys alike)."""
    rows_twopass_kernel[(-(-(nb * r) // rm), heads, cu.shape[0] - 1)](
        q, k, cu, cu, route, scratch, sm_scale, dense_below, q.shape[0], k.shape[0], heads, groups, nb, BLOCK=block,
        D=d, R=r, RM=rm, **options)
