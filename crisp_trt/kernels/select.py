"""select: per (sequence, head, query block) the off-diagonal key-block list attend consumes.

Grid (ceil(NB / QG), H, S), with ROWS (ceil(NB / QR), H, S): a program owns QG (QR) consecutive query blocks
of one head and reads their entries KC (KR) at a time. Blocks are absolute and a chunk's rows are those of the
query blocks it touches, (kv_len − q_len) // B …; the others stay unlisted.
  vertical-slash head  row qb lists the kept columns c < qb, then qb − x for each kept distance
                       x ≥ 1 whose block is not already a column (reference.vertical_slash_union);
  block-sparse head    p = softmax(pooled K[: qb + 1] · pooled q[qb] · scale) is written to the row's
                       scratch (one tl.dot per key chunk for QG rows; ROWS: rows.py wrote the sampled rows'
                       estimate there instead, reference.rows_mass), then the sink, the local blocks
                       and the candidates bisect.thresholds keeps (sampled noise floor, or cumulative
                       coverage) are listed in ascending order (reference.block_sparse_row);
  dense route          nothing: attend reads the sequence's dense flag.
Then (spike > 0) each listed row appends the blocks spike.py flagged that it does not hold yet, lowest first, at
most max_blocks of them (reference.add_spikes).
Lists need not be sorted (attend's online softmax does not care) but never hold a block twice.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .bisect import keep_rule, thresholds
from .bounds import chunk_bounds
from .launch import kernel

PROBES = tl.constexpr(4)  # bisect probes a step for the QG rows' thresholds: 14 serial passes over the rows, not 31


@triton.jit
def _append(src_ptr, src_base, n_ptr, head, idx_ptr, row, qb, row_ok, count, keep_c_ptr, col_base, MAXK,
            IS_DIST: tl.constexpr, KC: tl.constexpr):
    """Append to each row's list, in list order, the kept columns c < qb (IS_DIST: the blocks qb − x of kept
    distances x ≥ 1 that are not columns), KC list entries at a time; returns the new counts."""
    nv = tl.load(n_ptr + head)
    t0 = 0
    while t0 < nv:
        t = t0 + tl.arange(0, KC)
        val = tl.load(src_ptr + src_base + t, mask=t < nv, other=0)
        if IS_DIST:
            kb = qb[:, None] - val[None, :]
            flag = (t[None, :] < nv) & (val[None, :] >= 1) & (kb >= 0) & row_ok[:, None]
            flag = flag & (tl.load(keep_c_ptr + col_base + kb, mask=flag, other=1) == 0)
        else:
            kb = val[None, :] + 0 * qb[:, None]
            flag = (t[None, :] < nv) & (kb < qb[:, None]) & row_ok[:, None]
        pos = count[:, None] + tl.cumsum(flag.to(tl.int32), 1) - 1
        tl.store(idx_ptr + row[:, None] * MAXK + pos, kb, mask=flag)
        count += tl.sum(flag.to(tl.int32), 1)
        t0 += KC
    return count


@triton.jit
def _vertical_slash_rows(keep_c_ptr, keep_d_ptr, cols_ptr, ncols_ptr, dists_ptr, ndists_ptr, spk_ptr, idx_ptr,
                         counts_ptr, head, row, qb, row_ok, spike, max_blocks, NB, MAXK, MAXC, MAXD, KC: tl.constexpr):
    count = tl.zeros_like(qb)
    count = _append(cols_ptr, head.to(tl.int64) * MAXC, ncols_ptr, head, idx_ptr, row, qb, row_ok, count,
                    keep_c_ptr, head.to(tl.int64) * NB, MAXK, False, KC)
    count = _append(dists_ptr, head.to(tl.int64) * MAXD, ndists_ptr, head, idx_ptr, row, qb, row_ok, count,
                    keep_c_ptr, head.to(tl.int64) * NB, MAXK, True, KC)
    if spike > 0:  # the spikes that are neither a kept column nor on a kept diagonal
        top = tl.max(tl.where(row_ok, qb, 0), 0)
        taken = tl.zeros_like(qb)
        kb0 = 0
        while kb0 < top:
            kb = kb0 + tl.arange(0, KC)[None, :]
            ok = (kb < qb[:, None]) & row_ok[:, None]
            new = ok & (tl.load(spk_ptr + row[:, None] * NB + kb, mask=ok, other=0) != 0)
            new = new & (tl.load(keep_c_ptr + head.to(tl.int64) * NB + kb, mask=new, other=1) == 0)
            new = new & (tl.load(keep_d_ptr + head.to(tl.int64) * NB + qb[:, None] - kb, mask=new, other=1) == 0)
            flag = new & ((tl.cumsum(new.to(tl.int32), 1) + taken[:, None]) <= max_blocks)
            pos = count[:, None] + tl.cumsum(flag.to(tl.int32), 1) - 1
            tl.store(idx_ptr + row[:, None] * MAXK + pos, kb + 0 * pos, mask=flag)
            taken += tl.sum(new.to(tl.int32), 1)
            count += tl.sum(flag.to(tl.int32), 1)
            kb0 += KC
    tl.store(counts_ptr + row, count, mask=row_ok)


@triton.jit
def _block_sparse_rows(pq_ptr, pk_ptr, scratch_ptr, spk_ptr, idx_ptr, counts_ptr, s, h, row, qb, qb0, row_ok, nb,
                       sm_scale, kappa, quantile, gamma, spike, min_blocks, max_blocks, H, G, NB, MAXK, SINK, LOCAL,
                       SAMPLES,
                       D: tl.constexpr, FLOOR: tl.constexpr, MIN_TOP: tl.constexpr, QG: tl.constexpr,
                       C: tl.constexpr, ROWS: tl.constexpr):
    HK = H // G
    d = tl.arange(0, D)
    base = row * NB  # this row's scratch
    top = tl.max(tl.where(row_ok, qb, 0), 0) + 1
    m = tl.full([QG], float("-inf"), tl.float32)
    l = tl.zeros([QG], tl.float32)
    if not ROWS:  # ROWS: rows.py wrote the probabilities already
        qb_c = tl.minimum(tl.maximum(qb, qb0), nb - 1)  # a pooled row pool wrote, also for rows outside the chunk
        pq = tl.load(pq_ptr + ((s * NB + qb_c).to(tl.int64) * H + h)[:, None] * D + d[None, :])
        kb0 = 0
        while kb0 < top:  # pooled logits → scratch; row max and sum
            kb = kb0 + tl.arange(0, C)
            pk = tl.load(pk_ptr + ((s * NB + kb).to(tl.int64) * HK + h // G)[:, None] * D + d[None, :],
                         mask=(kb < nb)[:, None], other=0.0)
            z = tl.dot(pq, tl.trans(pk), input_precision="ieee") * sm_scale
            ok = (kb[None, :] <= qb[:, None]) & row_ok[:, None]
            z = tl.where(ok, z, float("-inf"))
            tl.store(scratch_ptr + base[:, None] + kb[None, :], z, mask=ok)
            m_new = tl.maximum(m, tl.max(z, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            l = l * tl.exp(m - m_safe) + tl.sum(tl.exp(z - m_safe[:, None]), 1)
            m = m_new
            kb0 += C
        tl.debug_barrier()
    lo = tl.minimum(SINK, qb + 1)
    hi = tl.maximum(lo, qb - LOCAL)
    cand_m = tl.where(row_ok, hi - lo, 0)
    inv = 1.0 / tl.where(l > 0, l, 1.0)
    all_mass = tl.zeros([QG], tl.float32)
    cand_mass = tl.zeros([QG], tl.float32)
    kb0 = 0
    while kb0 < top:  # scratch ← probabilities (ROWS: read them)
        kb = kb0 + tl.arange(0, C)
        ok = (kb[None, :] <= qb[:, None]) & row_ok[:, None]
        if ROWS:
            p = tl.load(scratch_ptr + base[:, None] + kb[None, :], mask=ok, other=0.0)
        else:
            p = tl.exp(tl.load(scratch_ptr + base[:, None] + kb[None, :], mask=ok, other=float("-inf")) - m[:, None])
            p = p * inv[:, None]
            tl.store(scratch_ptr + base[:, None] + kb[None, :], p, mask=ok)
        all_mass += tl.sum(p, 1)
        cand_mass += tl.sum(tl.where((kb[None, :] >= lo[:, None]) & (kb[None, :] < hi[:, None]), p, 0.0), 1)
        kb0 += C
    tl.debug_barrier()
    none = tl.zeros([QG], tl.int32) - 1
    one = tl.zeros([QG], tl.float32) + 1.0
    gt, ge, cap = thresholds(scratch_ptr, scratch_ptr, base, lo, cand_m, all_mass - cand_mass, scratch_ptr, lo,
                             cand_m, tl.minimum(cand_m, SAMPLES), none, one, 1.0, kappa, quantile, gamma,
                             min_blocks, max_blocks, FLOOR, MIN_TOP, C, PROBES)
    taken = tl.zeros([QG], tl.int32)
    spiked = tl.zeros([QG], tl.int32)
    count = tl.zeros([QG], tl.int32)
    kb0 = 0
    while kb0 < top:  # list: sink, kept candidates (at most max_blocks, ascending), local, then the spikes
        kb = kb0 + tl.arange(0, C)[None, :]
        ok = (kb < qb[:, None]) & row_ok[:, None]
        p = tl.load(scratch_ptr + base[:, None] + kb, mask=ok, other=0.0)
        cand = ok & (kb >= lo[:, None]) & (kb < hi[:, None]) & keep_rule(p, p, gt, ge, cap)
        within = (tl.cumsum(cand.to(tl.int32), 1) + taken[:, None]) <= max_blocks
        flag = ok & ((kb < lo[:, None]) | (kb >= hi[:, None]) | (cand & within))
        new = ok & ~flag & (tl.load(spk_ptr + row[:, None] * NB + kb, mask=ok & (spike > 0), other=0) != 0)
        flag = flag | (new & ((tl.cumsum(new.to(tl.int32), 1) + spiked[:, None]) <= max_blocks))
        pos = count[:, None] + tl.cumsum(flag.to(tl.int32), 1) - 1
        tl.store(idx_ptr + row[:, None] * MAXK + pos, kb + 0 * pos, mask=flag)
        taken += tl.sum(cand.to(tl.int32), 1)
        spiked += tl.sum(new.to(tl.int32), 1)
        count += tl.sum(flag.to(tl.int32), 1)
        kb0 += C
    tl.store(counts_ptr + row, count, mask=row_ok)


@kernel
def select_kernel(cu_ptr, cu_k_ptr, route_ptr, keep_c_ptr, keep_d_ptr, cols_ptr, ncols_ptr, dists_ptr, ndists_ptr,
                  pq_ptr, pk_ptr, scratch_ptr, spk_ptr, idx_ptr, counts_ptr, sm_scale, kappa, quantile, gamma, spike,
                  min_blocks, max_blocks,
                  total, total_k, H, G, NB, MAXK, BLOCK, SINK, LOCAL, MAXC, MAXD, SAMPLES, D: tl.constexpr,
                  FLOOR: tl.constexpr, MIN_TOP: tl.constexpr, ROWS: tl.constexpr, QG: tl.constexpr, KC: tl.constexpr,
                  QR: tl.constexpr, KR: tl.constexpr):
    QN: tl.constexpr = QR if ROWS else QG  # rows mode has no pooled tl.dot (16 rows): more, shorter programs
    CN: tl.constexpr = KR if ROWS else KC
    g = tl.num_programs(0) - 1 - tl.program_id(0)  # the latest query blocks (the longest rows) first
    h = tl.program_id(1)
    s = tl.program_id(2)
    _, q_len, _, n = chunk_bounds(cu_ptr, cu_k_ptr, s, total, total_k, NB * BLOCK)
    nb = (n + BLOCK - 1) // BLOCK
    qb0 = (n - q_len) // BLOCK  # the chunk's first query block
    if (g * QN >= nb) | (g * QN + QN <= qb0):
        return
    head = s * H + h
    route = tl.load(route_ptr + head)
    qb = g * QN + tl.arange(0, QN)
    row_ok = (qb < nb) & (qb >= qb0)
    row = head.to(tl.int64) * NB + qb
    if route == 1:
        _vertical_slash_rows(keep_c_ptr, keep_d_ptr, cols_ptr, ncols_ptr, dists_ptr, ndists_ptr, spk_ptr, idx_ptr,
                             counts_ptr, head, row, qb, row_ok, spike, max_blocks, NB, MAXK, MAXC, MAXD, CN)
    if route == 2:
        _block_sparse_rows(pq_ptr, pk_ptr, scratch_ptr, spk_ptr, idx_ptr, counts_ptr, s, h, row, qb, qb0, row_ok, nb,
                           sm_scale, kappa, quantile, gamma, spike, min_blocks, max_blocks, H, G, NB, MAXK, SINK, LOCAL,
                           SAMPLES, D,
                           FLOOR, MIN_TOP and not FLOOR, QN, CN, ROWS)  # the floor budget has no min top-k here
