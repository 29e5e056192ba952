"""attend: causal block-sparse flash attention over per-(seq, head, q-block) key-block lists.

One program per (head, query block, sequence), heads fastest. It walks the off-diagonal key blocks listed in
idx[s, h, qb, :counts[s, h, qb]] (or, for a sequence flagged dense, every block kb < qb), then the
diagonal block with the causal mask, with an fp32 online softmax (exp2). GQA reads kv head h // G
directly (K/V are never repeated); varlen via cu_seqlens (programs past a sequence's end exit). Chunks: a
sequence's queries (cu_seqlens) are the last q_len of its kv_len keys (cu_seqlens_k); query blocks are absolute
and programs of blocks before the chunk exit. With write_lse ≠ 0 each row's log-sum-exp (natural log) of
the scaled logits goes to lse [total_q, H] f32: (m + log2 l) · ln 2, m and l the exp2-domain running max and sum.
With TMA (launch.tma: sm_90+, BLOCK 128, d 64) the listed K / V blocks load through two device-side tensor
descriptors, which Triton writes into the workspace's `descriptors` buffer (its global scratch); same math.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import contract
from .bounds import chunk_bounds
from .launch import arch_of, grid, kernel, or_unused, run, tma

DESCRIPTORS = contract.CONSTANTS["DESCRIPTORS"]  # bytes per program


@triton.jit
def _attend_block(acc, m_i, l_i, q, k_src, v_src, at_row, at_col, key_ok, causal_ok, qk_scale, MASKED: tl.constexpr,
                  TMA: tl.constexpr):
    """One key block of the online softmax: returns updated (acc, m_i, l_i). K / V come from pointer tiles
    k_src / v_src, or with TMA from descriptors at [at_row, at_col]. MASKED (the diagonal block, pointers):
    keys past the sequence read as 0 and causal_ok masks the scores; else every key is in the sequence and
    the loads and scores go unmasked, the scale fused into the exponent (one FMA) and P·V accumulated into
    acc by the dot itself (H200: 400 → 446 TFLOP/s dense at 128k, bench/NOTES session 6)."""
    if MASKED:
        k = tl.load(k_src, mask=key_ok[:, None], other=0.0)
        s = tl.where(causal_ok, tl.dot(q, tl.trans(k)) * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        v = tl.load(v_src, mask=key_ok[:, None], other=0.0)
    else:
        if TMA:
            k = k_src.load([at_row, at_col])
        else:
            k = tl.load(k_src)
        s = tl.dot(q, tl.trans(k))
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        p = tl.exp2(s * qk_scale - m_new[:, None])
        if TMA:
            v = v_src.load([at_row, at_col])
        else:
            v = tl.load(v_src)
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, m_new, l_i


@triton.jit
def _listed_block(acc, m_i, l_i, q, i, idx_ptr, row, listed, dense, start, qb, k_src, v_src, hk, qk_scale,
                  HK, MAXK, BLOCK: tl.constexpr, D: tl.constexpr, TMA: tl.constexpr):
    """The i-th off-diagonal key block of this row (from the list, or kb = i when dense). Clamped to
    [0, qb): every key of such a block lies inside the sequence, so its loads need no mask. k_src / v_src:
    the K / V base pointers, or with TMA their descriptors."""
    kb = tl.load(idx_ptr + row.to(tl.int64) * MAXK + i * listed) * listed + i * dense
    kb = tl.maximum(tl.minimum(kb, qb - 1), 0)
    if TMA:
        return _attend_block(acc, m_i, l_i, q, k_src, v_src, start + kb * BLOCK, hk * D, None, None, qk_scale,
                             False, True)
    else:
        rows = tl.arange(0, BLOCK)
        cols = tl.arange(0, D)
        k_pos = kb * BLOCK + rows
        kv_off = ((start + k_pos).to(tl.int64) * HK + hk) * D
        return _attend_block(acc, m_i, l_i, q, k_src + kv_off[:, None] + cols[None, :],
                             v_src + kv_off[:, None] + cols[None, :], 0, 0, None, None, qk_scale, False, False)


@kernel
def attend_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, cu_ptr, cu_k_ptr, idx_ptr, cnt_ptr, dense_ptr, sm_scale,
                  total, total_k, write_lse, H, G, NQB, MAXK, BLOCK: tl.constexpr, D: tl.constexpr,
                  INTERPRET: tl.constexpr, TMA: tl.constexpr):
    h = tl.program_id(0)  # a query block's heads together: GQA groups share K / V reads in L2
    qb = NQB - 1 - tl.program_id(1)  # the longest key lists first, over every head: a shorter tail on the last wave
    s = tl.program_id(2)
    q_start, q_len, start, n = chunk_bounds(cu_ptr, cu_k_ptr, s, total, total_k, NQB * BLOCK)
    first = n - q_len  # the chunk's first position
    if (qb * BLOCK >= n) | (qb * BLOCK + BLOCK <= first):
        return
    hk = h // G
    HK = H // G
    rows = tl.arange(0, BLOCK)
    cols = tl.arange(0, D)
    q_pos = qb * BLOCK + rows
    q_ok = (q_pos >= first) & (q_pos < n)
    q_row = (q_start - first + q_pos).to(tl.int64) * H + h
    q_off = q_row * D
    q = tl.load(q_ptr + q_off[:, None] + cols[None, :], mask=q_ok[:, None], other=0.0)
    qk_scale = sm_scale * 1.4426950408889634
    m_i = tl.full([BLOCK], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK], tl.float32)
    acc = tl.zeros([BLOCK, D], tl.float32)
    dense = tl.load(dense_ptr + s)  # 1: every causal block, 0: the listed ones
    listed = 1 - dense
    row = (s * H + h) * NQB + qb
    count = tl.load(cnt_ptr + row) * listed + qb * dense
    if TMA:
        k_src = tl.make_tensor_descriptor(k_ptr, shape=[total_k, HK * D], strides=[HK * D, 1], block_shape=[BLOCK, D])
        v_src = tl.make_tensor_descriptor(v_ptr, shape=[total_k, HK * D], strides=[HK * D, 1], block_shape=[BLOCK, D])
    else:
        k_src = k_ptr
        v_src = v_ptr
    if INTERPRET:  # the interpreter cannot range() over a bound loaded from memory
        i = 0
        while i < count:
            acc, m_i, l_i = _listed_block(acc, m_i, l_i, q, i, idx_ptr, row, listed, dense, start, qb, k_src, v_src,
                                          hk, qk_scale, HK, MAXK, BLOCK, D, TMA)
            i += 1
    else:  # tl.range: software-pipelined K/V loads on the GPU
        for i in tl.range(0, count):
            acc, m_i, l_i = _listed_block(acc, m_i, l_i, q, i, idx_ptr, row, listed, dense, start, qb, k_src, v_src,
                                          hk, qk_scale, HK, MAXK, BLOCK, D, TMA)
    k_pos = qb * BLOCK + rows
    kv_off = ((start + k_pos).to(tl.int64) * HK + hk) * D
    causal = (k_pos[None, :] <= q_pos[:, None]) & (k_pos[None, :] < n)
    acc, m_i, l_i = _attend_block(acc, m_i, l_i, q, k_ptr + kv_off[:, None] + cols[None, :],
                                  v_ptr + kv_off[:, None] + cols[None, :], 0, 0, k_pos < n, causal, qk_scale, True,
                                  False)
    out = acc / l_i[:, None]
    tl.store(o_ptr + q_off[:, None] + cols[None, :], out.to(o_ptr.dtype.element_ty), mask=q_ok[:, None])
    if write_lse != 0:
        tl.store(lse_ptr + q_row, (m_i + tl.log2(l_i)) * 0.6931471805599453, mask=q_ok)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, idx: torch.Tensor,
           counts: torch.Tensor, dense: torch.Tensor, block: int, out: torch.Tensor | None = None,
           cu_seqlens_k: torch.Tensor | None = None, lse: torch.Tensor | None = None,
           descriptors: torch.Tensor | None = None) -> torch.Tensor:
    """Launch attend. q [total_q, H, d], k, v [total_k, Hkv, d] (cu_seqlens_k; default: cu_seqlens, whole
    prompts); idx [S, H, NQB, MAXK] int32 (off-diagonal key blocks of absolute query blocks), counts [S, H, NQB]
    int32, dense [S] int32 (1: every causal block); lse: f32 [total_q, H] to write the LSE into, or None;
    descriptors: the workspace's bytes for the TMA descriptors (allocated here when None and launch.tma holds).
    Grid (H, NQB, S)."""
    total, heads, d = q.shape
    seqs, _, nqb, maxk = idx.shape
    out = torch.empty_like(q) if out is None else out
    cu_k = cu_seqlens if cu_seqlens_k is None else cu_seqlens_k
    if descriptors is None and tma(block, d, arch_of(q)):
        descriptors = torch.empty(seqs * heads * nqb * DESCRIPTORS, dtype=torch.uint8, device=q.device)
    run(attend_kernel, grid("attend", nb=nqb, H=heads, S=seqs), q, k, v, out, or_unused(lse, q), cu_seqlens, cu_k,
        idx, counts, dense, 1.0 / math.sqrt(d), total, k.shape[0], int(lse is not None), heads, heads // k.shape[1],
        nqb, maxk, block=block, d=d, scratch=descriptors, BLOCK=block, D=d)
    return out
