"""rows: the sampled-row estimate select ranks block-sparse rows by (CrispConfig.rows > 0; reference.rows_mass).

A tile is the R sampled rows (the last of every BLOCK / R, clamped to the chunk: reference.sampled_rows) of RM / R
consecutive query blocks of one (sequence, head): one [RM, D] tile of queries, whose exact causal softmax against
every key up to each row select needs, summed per key block and averaged over a query block's rows, in its scratch
row scratch[s, h, qb, kb] (instead of the pooled softmax). One pass over the key blocks keeps each row's running
max and Σexp2 and writes each block's log2-sum-exp2 (at the running max of the moment) into the program's slot
[NB, RM] f32; a short loop then turns them into shares, exp2(L − lse). So every key is read and exponentiated once.
Persistent grid: min(RS, tiles) programs, one slot each, walk the tiles latest-first (the most keys first, the
short ones fill the tail); tiles of other heads are skipped. Key blocks before a tile's first query block go
unmasked. Cost ≈ R / BLOCK of dense attention's logits.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .bounds import chunk_bounds
from .launch import kernel


@triton.jit
def _logits(q, k_ptr, k_start, kb, pos, last, qk_scale, hk, HK, BLOCK: tl.constexpr, D: tl.constexpr,
            MASKED: tl.constexpr):
    """Log2-domain logits [RM, BLOCK] of the sampled rows at positions pos against key block kb. MASKED (a block at
    or after the tile's first query block): keys after each row masked, keys after `last` (the latest row) not
    read; else every key precedes every row and nothing is masked."""
    kpos = kb * BLOCK + tl.arange(0, BLOCK)
    k_src = k_ptr + ((k_start + kpos).to(tl.int64) * HK + hk)[:, None] * D + tl.arange(0, D)[None, :]
    if MASKED:
        x = tl.dot(q, tl.trans(tl.load(k_src, mask=(kpos <= last)[:, None], other=0.0))) * qk_scale
        return tl.where(kpos[None, :] <= pos[:, None], x, float("-inf"))
    else:
        return tl.dot(q, tl.trans(tl.load(k_src))) * qk_scale


@triton.jit
def _blocks_lse(m, l, slot, q, k_ptr, k_start, lo, hi, pos, last, qk_scale, hk, HK, BLOCK: tl.constexpr,
                D: tl.constexpr, RM: tl.constexpr, MASKED: tl.constexpr):
    """Key blocks [lo, hi): each row's running max and Σexp2, and each block's log2-sum-exp2 into slot[kb]."""
    t = tl.arange(0, RM)
    for kb in range(lo, hi):
        x = _logits(q, k_ptr, k_start, kb, pos, last, qk_scale, hk, HK, BLOCK, D, MASKED)
        m_new = tl.maximum(m, tl.max(x, 1))
        s = tl.sum(tl.exp2(x - m_new[:, None]), 1)
        tl.store(slot + kb * RM + t, m_new + tl.log2(s))
        l = l * tl.exp2(m - m_new) + s
        m = m_new
    return m, l


@kernel
def rows_kernel(q_ptr, k_ptr, cu_ptr, cu_k_ptr, route_ptr, scratch_ptr, slots_ptr, sm_scale, dense_below, total,
                total_k, seqs, H, G, NB, BLOCK: tl.constexpr, D: tl.constexpr, R: tl.constexpr, RM: tl.constexpr,
                KC: tl.constexpr):
    slot = slots_ptr + tl.program_id(0).to(tl.int64) * NB * RM
    ng = (NB * R + RM - 1) // RM  # tiles per (sequence, head)
    t = tl.arange(0, RM)
    d = tl.arange(0, D)
    qk_scale = sm_scale * 1.4426950408889634
    for tile in range(tl.program_id(0), ng * H * seqs, tl.num_programs(0)):
        g = ng - 1 - tile // (H * seqs)  # the latest query blocks (the most keys) first
        h = tile % H
        s = (tile // H) % seqs
        q_start, q_len, k_start, n = chunk_bounds(cu_ptr, cu_k_ptr, s, total, total_k, NB * BLOCK)
        first = n - q_len
        qb_lo = g * (RM // R)
        todo = (n >= dense_below) & (qb_lo * BLOCK < n) & ((qb_lo + RM // R) * BLOCK > first)
        if todo:
            todo = tl.load(route_ptr + s * H + h) == 2
        if todo:
            qb = qb_lo + t // R  # each row's query block
            pos = tl.minimum(tl.maximum(qb * BLOCK + (BLOCK // R) * (t % R + 1) - 1, first), n - 1)
            q = tl.load(q_ptr + ((q_start - first + pos).to(tl.int64) * H + h)[:, None] * D + d[None, :])
            hk, HK = h // G, H // G
            last = tl.max(pos, 0)
            top = last // BLOCK + 1  # key blocks [0, qb_lo) precede every row; [qb_lo, top) need the causal mask
            m, l = _blocks_lse(tl.full([RM], float("-inf"), tl.float32), tl.zeros([RM], tl.float32), slot, q, k_ptr,
                               k_start, 0, qb_lo, pos, last, qk_scale, hk, HK, BLOCK, D, RM, False)
            m, l = _blocks_lse(m, l, slot, q, k_ptr, k_start, qb_lo, top, pos, last, qk_scale, hk, HK, BLOCK, D, RM,
                               True)
            lse = m + tl.log2(l)  # every row has its own key: l ≥ 1
            tl.debug_barrier()  # the slot's stores before its loads
            blocks = qb_lo + tl.arange(0, RM // R)
            ok = (blocks * BLOCK < n) & (blocks * BLOCK + BLOCK > first)
            out = scratch_ptr + ((s * H + h).to(tl.int64) * NB + blocks) * NB
            for kb0 in range(0, top, KC):  # shares, KC key blocks at a time, averaged over a query block's rows
                kb = kb0 + tl.arange(0, KC)
                share = tl.exp2(tl.load(slot + kb[:, None] * RM + t[None, :], mask=(kb < top)[:, None],
                                        other=float("-inf")) - lse[None, :]) / R
                mass = tl.sum(tl.reshape(share, (KC, RM // R, R)), 2)
                tl.store(out[None, :] + kb[:, None], mass, mask=ok[None, :] & (kb[:, None] <= blocks[None, :]))
            tl.debug_barrier()  # the slot's loads before the next tile's stores
