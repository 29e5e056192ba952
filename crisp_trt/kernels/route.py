"""route: per head, the vertical-slash selection, its C_struct, and the route (reference.route).

One program per (head, sequence). From estimate's per-block vsum/vmax/ssum/smax it keeps column
blocks (sink always, candidates by bisect.thresholds) and offset blocks (local always), turns offsets
into diagonal distances (offset block ob touches distances ob and ob + 1), writes both as bool maps
and as compact ascending lists for select, then C_struct = Σ vsum over the key blocks the last query
block attends; while C_struct < coverage, kappa halves and the selection is redone (≤ `steps` kappas,
CrispConfig.kappas); then route = C_struct ≥ tau; then, under the floor rule, a head whose C_struct reached
coverage drops its lightest kept columns and offsets while C_struct stays ≥ coverage (`_trim`, one mass
threshold found by bisect's search, 16 probes a step while C ≤ 128: reference.trim_to_coverage). With JSD routing,
route_jsd_kernel (same grid, launched next) overwrites the route with sqrt(JSD(vsum, pooled-Q·K)) ≥ tau. Sequences
below dense_below get route 0 (dense) and dense[s] = 1.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .bisect import INF_BITS, keep_rule, narrow, probes, search_steps, thresholds
from .bounds import chunk_bounds
from .launch import kernel


@triton.jit
def _keep_blocks(mass_ptr, score_ptr, base, lo, hi, always_hi, nb, width_last, kappa, quantile, gamma,
                 min_blocks, max_blocks, keep_ptr, BLOCK, FLOOR: tl.constexpr, MIN_TOP: tl.constexpr,
                 C: tl.constexpr, P: tl.constexpr, CS: tl.constexpr):
    """Keep map (int8, 1 = kept) of one head's blocks: [0, always_hi) always, candidates [lo, hi); the threshold
    searches take CS-wide chunks with P probes a step (bisect)."""
    lo_v = tl.zeros([1], tl.int32) + lo
    m_v = tl.zeros([1], tl.int32) + (hi - lo)
    base_v = tl.zeros([1], tl.int64) + base
    last_v = tl.zeros([1], tl.int32) + (nb - 1)
    wl_v = tl.zeros([1], tl.float32) + width_last
    cand_mass = tl.zeros([1], tl.float32)
    all_mass = tl.zeros([1], tl.float32)
    t0 = 0
    while t0 < nb:
        j = t0 + tl.arange(0, C)[None, :]
        x = tl.load(mass_ptr + base + j, mask=j < nb, other=0.0)
        all_mass += tl.sum(x, 1)
        cand_mass += tl.sum(tl.where((j >= lo) & (j < hi), x, 0.0), 1)
        t0 += C
    gt, ge, cap = thresholds(mass_ptr, score_ptr, base_v, lo_v, m_v, all_mass - cand_mass, mass_ptr, lo_v, m_v,
                             m_v, last_v, wl_v, BLOCK * 1.0, kappa, quantile, gamma, min_blocks, max_blocks,
                             FLOOR, MIN_TOP, CS, P)
    rank_ptr = score_ptr if FLOOR else mass_ptr
    taken = tl.zeros([1], tl.int32)
    t0 = 0
    while t0 < nb:
        j = t0 + tl.arange(0, C)[None, :]
        rank = tl.load(rank_ptr + base + j, mask=j < nb, other=0.0)
        mass = tl.load(mass_ptr + base + j, mask=j < nb, other=0.0)
        cand = (j >= lo) & (j < hi) & keep_rule(rank, mass, gt, ge, cap)
        within = (tl.cumsum(cand.to(tl.int32), 1) + taken) <= max_blocks
        keep = (j < always_hi) | (cand & within)
        tl.store(keep_ptr + base + j, keep.to(tl.int8), mask=j < nb)
        taken += tl.sum(cand.to(tl.int32), 1)
        t0 += C


@triton.jit
def _compact(src_ptr, base, nb, dst_ptr, dst_base, C: tl.constexpr):
    """Ascending list of the set entries of an int8 map → dst; returns the count."""
    count = 0
    t0 = 0
    while t0 < nb:
        j = t0 + tl.arange(0, C)
        flag = tl.load(src_ptr + base + j, mask=j < nb, other=0) != 0
        pos = count + tl.cumsum(flag.to(tl.int32), 0) - 1
        tl.store(dst_ptr + dst_base + pos, j, mask=flag)
        count += tl.sum(flag.to(tl.int32), 0)
        t0 += C
    return count


@triton.jit
def _jsd(vsum_ptr, base, q_ptr, pk_ptr, s, q_end, nb, rows, h, hk, sm_scale, H, HK, NB, L: tl.constexpr,
         D: tl.constexpr):
    """sqrt(JSD) (base 2) of vsum and softmax(pooled K · mean of the window's queries (the `rows` query rows
    before q_end) · scale)."""
    JC: tl.constexpr = 32  # key blocks per [JC, D] pooled-K tile
    i = tl.arange(0, L)
    d = tl.arange(0, D)
    r = q_end - rows + i
    qw = tl.load(q_ptr + (r.to(tl.int64) * H + h)[:, None] * D + d[None, :], mask=(i < rows)[:, None], other=0.0)
    qw = tl.sum(qw.to(tl.float32), 0) / rows.to(tl.float32)
    seq_base = pk_ptr + (s.to(tl.int64) * NB * HK + hk) * D
    m = float("-inf")
    ssum = 0.0
    t0 = 0
    while t0 < nb:  # pass 1: max and sum of the pooled logits
        j = t0 + tl.arange(0, JC)
        pk = tl.load(seq_base + (j * HK)[:, None] * D + d[None, :], mask=(j < nb)[:, None], other=0.0)
        z = tl.where(j < nb, tl.sum(pk * qw[None, :], 1) * sm_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(z, 0))
        ssum = ssum * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new), 0)
        m = m_new
        t0 += JC
    kl = 0.0
    t0 = 0
    while t0 < nb:  # pass 2: 0.5 KL(v || mid) + 0.5 KL(p || mid)
        j = t0 + tl.arange(0, JC)
        pk = tl.load(seq_base + (j * HK)[:, None] * D + d[None, :], mask=(j < nb)[:, None], other=0.0)
        z = tl.where(j < nb, tl.sum(pk * qw[None, :], 1) * sm_scale, float("-inf"))
        p = tl.exp(z - m) / ssum
        v = tl.load(vsum_ptr + base + j, mask=j < nb, other=0.0)
        mid = tl.maximum(0.5 * (p + v), 1e-30)
        kl += tl.sum(tl.where(v > 0, v * tl.log2(v / mid), 0.0) + tl.where(p > 0, p * tl.log2(p / mid), 0.0), 0)
        t0 += JC
    return tl.sqrt(tl.maximum(0.5 * kl, 0.0))


@triton.jit
def _diagonals(keep_o_ptr, keep_d_ptr, base, nb, C: tl.constexpr):
    """Distances from the offset map: offset block ob touches distances ob and ob + 1."""
    t0 = 0
    while t0 < nb:
        jj = t0 + tl.arange(0, C)
        here = tl.load(keep_o_ptr + base + jj, mask=jj < nb, other=0)
        prev = tl.load(keep_o_ptr + base + jj - 1, mask=(jj >= 1) & (jj < nb), other=0)
        tl.store(keep_d_ptr + base + jj, here | prev, mask=jj < nb)
        t0 += C
    tl.debug_barrier()


@triton.jit
def _diagonals_cstruct(keep_c_ptr, keep_o_ptr, keep_d_ptr, vsum_ptr, base, nb, C: tl.constexpr):
    """_diagonals, then C_struct = Σ vsum over the last query block's key blocks: kept columns ∪ kept
    distances (clamped to [0, 1])."""
    _diagonals(keep_o_ptr, keep_d_ptr, base, nb, C)
    c_struct = 0.0
    t0 = 0
    while t0 < nb:
        jj = t0 + tl.arange(0, C)
        col = tl.load(keep_c_ptr + base + jj, mask=jj < nb, other=0)
        diag = tl.load(keep_d_ptr + base + (nb - 1 - jj), mask=jj < nb, other=0)
        v = tl.load(vsum_ptr + base + jj, mask=jj < nb, other=0.0)
        c_struct += tl.sum(tl.where((col | diag) != 0, v, 0.0), 0)
        t0 += C
    tl.debug_barrier()
    return tl.minimum(tl.maximum(c_struct, 0.0), 1.0)


@triton.jit
def _above(keep_ptr, mass_ptr, base, j, nb, lo, t_bits):
    """Whether entry j of a keep map stays under threshold bits t: kept, and always (j < lo) or mass ≥ t;
    also whether it is a kept candidate that stays (counted against the min budget)."""
    ok = (j >= 0) & (j < nb)
    kept = tl.load(keep_ptr + base + j, mask=ok, other=0) != 0
    heavy = tl.load(mass_ptr + base + j, mask=ok, other=0.0).to(tl.int32, bitcast=True) >= t_bits
    return kept & ((j < lo) | heavy), kept & (j >= lo) & heavy


@triton.jit
def _trimmed(keep_c_ptr, keep_o_ptr, vsum_ptr, ssum_ptr, base, nb, v_lo, s_lo, t_bits, C: tl.constexpr):
    """Under each threshold's bits t (t_bits [T, 1]): ([T] each) the last query block's covered vsum, kept
    candidate columns, offsets."""
    covered = tl.zeros([t_bits.shape[0]], tl.float32)
    n_c = tl.zeros([t_bits.shape[0]], tl.int32)
    n_o = tl.zeros([t_bits.shape[0]], tl.int32)
    t0 = 0
    while t0 < nb:
        jj = t0 + tl.arange(0, C)[None, :]
        dist = nb - 1 - jj  # key block jj of the last query block sits at distance dist: offsets dist, dist − 1
        col, col_cand = _above(keep_c_ptr, vsum_ptr, base, jj, nb, v_lo, t_bits)
        off, off_cand = _above(keep_o_ptr, ssum_ptr, base, dist, nb, s_lo, t_bits)
        off_prev = _above(keep_o_ptr, ssum_ptr, base, dist - 1, nb, s_lo, t_bits)[0]
        v = tl.load(vsum_ptr + base + jj, mask=jj < nb, other=0.0)
        covered += tl.sum(tl.where((jj < nb) & (col | off | off_prev), v, 0.0), 1)
        n_c += tl.sum((col_cand & (jj < nb)).to(tl.int32), 1)
        n_o += tl.sum((off_cand & (jj < nb)).to(tl.int32), 1)
        t0 += C
    return covered, n_c, n_o


@triton.jit
def _trim(keep_c_ptr, keep_o_ptr, vsum_ptr, ssum_ptr, base, nb, v_lo, s_lo, coverage, min_blocks,
          C: tl.constexpr, P: tl.constexpr, CS: tl.constexpr):
    """The mass-ordered stop (reference.trim_to_coverage): the largest t, by a search on f32 bits (P probes a
    step, bisect.narrow), under which the kept columns (vsum ≥ t) and offsets (ssum ≥ t) still cover
    `coverage` and each keeps min(min_blocks, kept) candidates; then drops the candidates below t from both
    keep maps (the search in CS-wide chunks, the drop in C-wide ones)."""
    zero_bits = tl.zeros([1], tl.int32)
    whole = _trimmed(keep_c_ptr, keep_o_ptr, vsum_ptr, ssum_ptr, base, nb, v_lo, s_lo, zero_bits[:, None], CS)
    need_c = tl.minimum(min_blocks, whole[1])
    need_o = tl.minimum(min_blocks, whole[2])
    lo_b = zero_bits
    hi_b = zero_bits + INF_BITS
    for _ in range(search_steps(P)):
        mid = probes(lo_b, hi_b, False, P)  # [1, P]
        covered, n_c, n_o = _trimmed(keep_c_ptr, keep_o_ptr, vsum_ptr, ssum_ptr, base, nb, v_lo, s_lo,
                                     tl.reshape(mid, (P, 1)), CS)
        holds = (covered >= coverage) & (n_c >= need_c) & (n_o >= need_o)
        lo_b, hi_b = narrow(lo_b, hi_b, mid, tl.reshape(holds, (1, P)), False, P)
    tl.debug_barrier()
    t0 = 0
    while t0 < nb:
        jj = t0 + tl.arange(0, C)
        col = _above(keep_c_ptr, vsum_ptr, base, jj, nb, v_lo, lo_b)[0]
        off = _above(keep_o_ptr, ssum_ptr, base, jj, nb, s_lo, lo_b)[0]
        tl.store(keep_c_ptr + base + jj, col.to(tl.int8), mask=jj < nb)
        tl.store(keep_o_ptr + base + jj, off.to(tl.int8), mask=jj < nb)
        t0 += C


@kernel
def route_kernel(vsum_ptr, vmax_ptr, ssum_ptr, smax_ptr, cu_ptr, cu_k_ptr, keep_c_ptr, keep_o_ptr, keep_d_ptr,
                 cols_ptr, ncols_ptr, dists_ptr, ndists_ptr, cstruct_ptr, route_ptr, dense_ptr, kappa, quantile, gamma,
                 tau, coverage, steps, min_blocks, max_blocks, dense_below, total, total_k, H, NB, BLOCK, SINK, LOCAL,
                 MAXC, MAXD, FLOOR: tl.constexpr, MIN_TOP: tl.constexpr, C: tl.constexpr):
    h = tl.program_id(0)
    s = tl.program_id(1)
    n = chunk_bounds(cu_ptr, cu_k_ptr, s, total, total_k, NB * BLOCK)[3]  # the route is the kv_len prefix's
    row = s * H + h
    short = n < dense_below
    if h == 0:
        tl.store(dense_ptr + s, short.to(tl.int32))
    if short | (tau > 1):  # dense; or block-sparse, as no score reaches tau > 1 (C_struct, sqrt(JSD) ≤ 1) and no
        # estimate ran (cfg.estimated): no lists either way
        tl.store(route_ptr + row, tl.where(short, 0, 2))
        tl.store(cstruct_ptr + row, tl.where(short & (n > 0), 1.0, 0.0))
        tl.store(ncols_ptr + row, 0)
        tl.store(ndists_ptr + row, 0)
        return
    nb = (n + BLOCK - 1) // BLOCK
    base = row.to(tl.int64) * NB
    width_last = (n - (nb - 1) * BLOCK).to(tl.float32)
    v_lo = tl.minimum(SINK, nb)
    v_hi = tl.maximum(v_lo, nb - 1 - LOCAL)
    s_lo = tl.minimum(LOCAL, nb)
    s_hi = nb
    if SINK > 0:
        s_hi = tl.maximum(s_lo, nb - 1 - SINK)
    P: tl.constexpr = 16 if C <= 128 else 1  # search probes a step (bisect): 4× fewer passes over a short row
    CS: tl.constexpr = 64 if C == 128 else C  # the searches' chunk: [16, 128] tiles spill (ptxas), [16, 64] fit
    c_struct = -1.0
    kappa_j = kappa
    j = 0
    while (j < steps) & (c_struct < coverage):  # kappa halves while the selection's C_struct < coverage
        _keep_blocks(vsum_ptr, vmax_ptr, base, v_lo, v_hi, v_lo, nb, width_last, kappa_j, quantile, gamma,
                     min_blocks, max_blocks, keep_c_ptr, BLOCK, FLOOR, MIN_TOP, C, P, CS)
        _keep_blocks(ssum_ptr, smax_ptr, base, s_lo, s_hi, s_lo, nb, width_last, kappa_j, quantile, gamma,
                     min_blocks, max_blocks, keep_o_ptr, BLOCK, FLOOR, MIN_TOP, C, P, CS)
        tl.debug_barrier()
        c_struct = _diagonals_cstruct(keep_c_ptr, keep_o_ptr, keep_d_ptr, vsum_ptr, base, nb, C)
        kappa_j = kappa_j * 0.5
        j += 1
    tl.store(route_ptr + row, tl.where(c_struct >= tau, 1, 2))  # decided before the trim
    if FLOOR:
        if (coverage > 0) & (c_struct >= coverage):
            _trim(keep_c_ptr, keep_o_ptr, vsum_ptr, ssum_ptr, base, nb, v_lo, s_lo, coverage, min_blocks, C, P, CS)
            tl.debug_barrier()
            _diagonals(keep_o_ptr, keep_d_ptr, base, nb, C)
    tl.store(ncols_ptr + row, _compact(keep_c_ptr, base, nb, cols_ptr, row.to(tl.int64) * MAXC, C))
    tl.store(ndists_ptr + row, _compact(keep_d_ptr, base, nb, dists_ptr, row.to(tl.int64) * MAXD, C))
    tl.store(cstruct_ptr + row, c_struct)  # the ladder's C_struct, the one that routed the head


@kernel
def route_jsd_kernel(vsum_ptr, cu_ptr, cu_k_ptr, q_ptr, pk_ptr, route_ptr, sm_scale, tau, dense_below, total, total_k,
                     H, G, NB, BLOCK, L: tl.constexpr, D: tl.constexpr):
    """JSD routing: route = 1 (vertical-slash) iff sqrt(JSD) ≥ tau, else 2, for sequences ≥ dense_below."""
    h = tl.program_id(0)
    s = tl.program_id(1)
    q_start, q_len, _, n = chunk_bounds(cu_ptr, cu_k_ptr, s, total, total_k, NB * BLOCK)
    if n < dense_below:
        return
    row = s * H + h
    score = _jsd(vsum_ptr, row.to(tl.int64) * NB, q_ptr, pk_ptr, s, q_start + q_len, (n + BLOCK - 1) // BLOCK,
                 tl.minimum(q_len, L), h, h // G, sm_scale, H, H // G, NB, L, D)
    tl.store(route_ptr + row, tl.where(score >= tau, 1, 2))
