"""Order statistics for select/route without sorting: bisection on the bit patterns of f32 values ≥ 0.

Each helper works on R rows at once (per-row vectors [R]); row r's entries are the values at
positions lo[r] + (t · m[r]) // cnt[r] for t < cnt[r] of `ptr + base[r]` — the contiguous range
[lo, lo + m) when cnt = m, or the strided noise-floor sample when cnt < m. Non-negative f32 values
order like their int32 bit patterns, so 31 halvings of [0, +inf] find an exact order statistic
(the reference's `torch.kthvalue`) with no sort, no host sync and fixed-size state. The value at
position `last[r]` is divided by `wlast[r]` and every other by `wdiv` (block widths), when asked.

P (a constexpr: 1, 2, 4, 8 or 16) is the number of probes per step: P = 1 is plain bisection (31 steps, one
pass over the rows each); P > 1 splits each row's interval into P + 1 parts per pass (4: 14 steps, 8: 10, 16: 8),
fewer serial passes for P times the compares per pass. Every P finds the same bit pattern (the mass threshold:
up to how its float sums round right at `need`).
"""
from __future__ import annotations

import triton
import triton.language as tl

INF_BITS = tl.constexpr(0x7F800000)  # bit pattern of +inf


@triton.jit
def search_steps(P: tl.constexpr):
    """Search steps that narrow [0, +inf]'s 2^31 bit patterns to one with P probes a step (each step leaves at most
    ceil(w / (P + 1)) of w; counted for P ∈ {1, 2, 4, 8, 16}, test_bisect checks the table)."""
    tl.static_assert((P == 1) | (P == 2) | (P == 4) | (P == 8) | (P == 16), "bisect: P must be 1, 2, 4, 8 or 16")
    if P == 1:
        return 31
    elif P == 2:
        return 20
    elif P == 4:
        return 14
    elif P == 8:
        return 10
    else:
        return 8


@triton.jit
def probes(lo_b, hi_b, FIRST: tl.constexpr, P: tl.constexpr):
    """A step's probe bit patterns [R, P], ascending along a row. FIRST: a smallest-true search over [lo, hi];
    else a largest-true one over (lo, hi], lo known true. Probe j is base + min((j + 1) · ceil(w / (P + 1)), w):
    the interval's w entries in P + 1 parts (no overflow: w < 2^31 and P · ceil(w / (P + 1)) < w + P)."""
    if FIRST:
        base = lo_b - 1
        w = tl.maximum(hi_b - lo_b + 1, 0)
    else:
        base = lo_b
        w = tl.maximum(hi_b - lo_b, 0)
    step = (w + P) // (P + 1)
    return base[:, None] + tl.minimum((tl.arange(0, P)[None, :] + 1) * step[:, None], w[:, None])


@triton.jit
def narrow(lo_b, hi_b, p, true, FIRST: tl.constexpr, P: tl.constexpr):
    """The new [lo, hi] ([R] each) from probes p [R, P] and whether each holds (true [R, P]), monotone over a
    row's ascending probes: false → true for FIRST (smallest-true), true → false otherwise (largest-true)."""
    if P == 1:  # plain bisection in [R] vectors: picking probes from [R, 1] with _probe cost route (C = 1024) 6.6×
        # the code and 4× the shared memory in layout conversions
        mid = tl.reshape(p, [p.shape[0]])
        holds = tl.reshape(true, [true.shape[0]])
        if FIRST:
            return tl.where(holds, lo_b, mid + 1), tl.where(holds, mid, hi_b)
        else:
            return tl.where(holds, mid, lo_b), tl.where(holds, hi_b, mid - 1)
    t = tl.sum(true.to(tl.int32), 1)  # how many hold: a suffix (FIRST) or a prefix of each row's probes
    if FIRST:
        f = P - t
        return tl.where(f == 0, lo_b, _probe(p, f - 1, P) + 1), tl.where(f == P, hi_b, _probe(p, f, P))
    else:
        return tl.where(t == 0, lo_b, _probe(p, t - 1, P)), tl.where(t == P, hi_b, _probe(p, t, P) - 1)


@triton.jit
def _probe(p, i, P: tl.constexpr):
    """Per row r, probe i[r] of p [R, P] (0 for i outside [0, P))."""
    return tl.sum(tl.where(tl.arange(0, P)[None, :] == i[:, None], p, 0), 1)


@triton.jit
def load_rows(ptr, base, lo, m, cnt, last, wlast, wdiv, t0, C: tl.constexpr):
    """[R, C] values for entries t0 .. t0 + C of each row (0 where t ≥ cnt) and their validity."""
    t = t0 + tl.arange(0, C)[None, :]
    ok = t < cnt[:, None]
    pos = lo[:, None] + (t * m[:, None]) // tl.maximum(cnt[:, None], 1)
    x = tl.load(ptr + base[:, None] + pos, mask=ok, other=0.0)
    x = x / tl.where(pos == last[:, None], wlast[:, None], wdiv)
    return tl.where(ok, x, 0.0), ok


@triton.jit
def _bits(x):
    """The int32 bit patterns of f32 values (ordered like the values where x ≥ 0)."""
    return x.to(tl.int32, bitcast=True)


@triton.jit
def _count_le(x, ok, mid):
    """[R, P]: per row, how many valid entries x [R, C] have bits ≤ each probe mid [R, P]."""
    return tl.sum((ok[:, None, :] & (_bits(x)[:, None, :] <= mid[:, :, None])).to(tl.int32), 2)


@triton.jit
def _mass_ge(x, ok, mid):
    """[R, P]: per row, the sum of the valid entries x [R, C] whose bits are ≥ each probe mid [R, P]."""
    return tl.sum(tl.where(ok[:, None, :] & (_bits(x)[:, None, :] >= mid[:, :, None]), x[:, None, :], 0.0), 2)


@triton.jit
def kth_smallest(ptr, base, lo, m, cnt, k, last, wlast, wdiv, C: tl.constexpr, P: tl.constexpr):
    """Per row, the k[r]-th smallest (0-indexed) of its cnt[r] entries ([R] f32; +inf if k ≥ cnt)."""
    lo_b = tl.zeros_like(k)
    hi_b = tl.zeros_like(k) + INF_BITS
    top = tl.max(cnt, 0)
    for _ in range(search_steps(P)):
        mid = probes(lo_b, hi_b, True, P)
        below = tl.zeros(mid.shape, tl.int32)
        t0 = 0
        while t0 < top:
            x, ok = load_rows(ptr, base, lo, m, cnt, last, wlast, wdiv, t0, C)
            below += _count_le(x, ok, mid)
            t0 += C
        lo_b, hi_b = narrow(lo_b, hi_b, mid, below >= (k + 1)[:, None], True, P)
    return hi_b.to(tl.float32, bitcast=True)


@triton.jit
def mass_threshold(ptr, base, lo, m, cnt, need, last, wlast, wdiv, C: tl.constexpr, P: tl.constexpr):
    """Per row, the largest t with Σ{x ≥ t} x ≥ need[r] — keeping x ≥ t covers `need` with the fewest
    entries (the reference's sort + cumsum). 0 when even every entry falls short (keep all)."""
    lo_b = tl.zeros_like(cnt)
    hi_b = tl.zeros_like(cnt) + INF_BITS
    top = tl.max(cnt, 0)
    for _ in range(search_steps(P)):
        mid = probes(lo_b, hi_b, False, P)
        mass = tl.zeros(mid.shape, tl.float32)
        t0 = 0
        while t0 < top:
            x, ok = load_rows(ptr, base, lo, m, cnt, last, wlast, wdiv, t0, C)
            mass += _mass_ge(x, ok, mid)
            t0 += C
        lo_b, hi_b = narrow(lo_b, hi_b, mid, mass >= need[:, None], False, P)
    return lo_b.to(tl.float32, bitcast=True)


@triton.jit
def keep_rule(rank, mass, gt, ge, cap):
    """Kept iff (rank > gt or rank ≥ ge) and mass ≥ cap: floor rule, top-k / coverage rule, max-budget cap."""
    return ((rank > gt[:, None]) | (rank >= ge[:, None])) & (mass >= cap[:, None])


@triton.jit
def count_kept(rank_ptr, base, lo, m, gt, ge, C: tl.constexpr):
    """Per row over the contiguous range: the number of entries keep_rule keeps before any cap."""
    kept = tl.zeros_like(m)
    none = tl.zeros_like(m) - 1
    zero = tl.zeros_like(gt)
    top = tl.max(m, 0)
    t0 = 0
    while t0 < top:
        rank, ok = load_rows(rank_ptr, base, lo, m, m, none, zero + 1.0, 1.0, t0, C)
        kept += tl.sum((ok & keep_rule(rank, rank, gt, ge, zero)).to(tl.int32), 1)  # no cap: mass unread
        t0 += C
    return kept


@triton.jit
def kth_kept(rank_ptr, mass_ptr, base, lo, m, gt, ge, k, C: tl.constexpr, P: tl.constexpr):
    """Per row, the k[r]-th smallest (0-indexed) mass among the entries keep_rule keeps without a cap."""
    lo_b = tl.zeros_like(k)
    hi_b = tl.zeros_like(k) + INF_BITS
    none = tl.zeros_like(m) - 1
    zero = tl.zeros_like(gt)
    one = zero + 1.0
    top = tl.max(m, 0)
    for _ in range(search_steps(P)):
        mid = probes(lo_b, hi_b, True, P)
        below = tl.zeros(mid.shape, tl.int32)
        t0 = 0
        while t0 < top:
            rank, ok = load_rows(rank_ptr, base, lo, m, m, none, one, 1.0, t0, C)
            mass, mass_ok = load_rows(mass_ptr, base, lo, m, m, none, one, 1.0, t0, C)  # ok == mass_ok
            below += _count_le(mass, ok & keep_rule(rank, mass, gt, ge, zero), mid)
            t0 += C
        lo_b, hi_b = narrow(lo_b, hi_b, mid, below >= (k + 1)[:, None], True, P)
    return hi_b.to(tl.float32, bitcast=True)


@triton.jit
def thresholds(mass_ptr, score_ptr, base, lo, m, always, floor_ptr, floor_lo, floor_m, floor_cnt,
               last, wlast, wdiv, kappa, quantile, gamma, min_blocks, max_blocks,
               FLOOR: tl.constexpr, MIN_TOP: tl.constexpr, C: tl.constexpr, P: tl.constexpr):
    """(gt, ge, cap) per row for keep_rule over candidates [lo, lo + m) (reference._keep).

    FLOOR: gt = kappa · quantile of the floor entries (means mass/width, or the strided sample), tested on
    score; else ge = the coverage threshold of gamma − always, on mass. MIN_TOP adds the top min_blocks by
    that same statistic; when more than max_blocks are kept, cap keeps the max_blocks of them with the
    most mass under either rule (then the caller's cumulative cap breaks ties).
    """
    inf = tl.zeros_like(always) + float("inf")
    zero = tl.zeros_like(always)
    none = tl.zeros_like(lo) - 1
    if FLOOR:
        kq = (quantile * (floor_cnt - 1).to(tl.float32)).to(tl.int32)
        floor = kth_smallest(floor_ptr, base, floor_lo, floor_m, floor_cnt, kq, last, wlast, wdiv, C, P)
        gt = tl.where(floor_cnt > 0, kappa * floor, inf)
        ge = inf
        rank_ptr = score_ptr
    else:
        need = gamma - always
        reach = mass_threshold(mass_ptr, base, lo, m, m, need, none, zero + 1.0, 1.0, C, P)
        gt = inf
        ge = tl.where(need <= 0, inf, reach)
        rank_ptr = mass_ptr
    kept = count_kept(rank_ptr, base, lo, m, gt, ge, C)
    if MIN_TOP:
        fk = tl.minimum(min_blocks, m)
        short = (kept < fk) & (fk > 0)
        if tl.max(short.to(tl.int32), 0) > 0:
            top = kth_smallest(rank_ptr, base, lo, m, m, m - fk, none, zero + 1.0, 1.0, C, P)
            ge = tl.where(short, tl.minimum(ge, top), ge)
            kept = count_kept(rank_ptr, base, lo, m, gt, ge, C)
    over = (kept > max_blocks) & (m > max_blocks)
    cap = zero
    if tl.max(over.to(tl.int32), 0) > 0:
        cut = kth_kept(rank_ptr, mass_ptr, base, lo, m, gt, ge, kept - max_blocks, C, P)
        cap = tl.where(over, cut, zero)
    return gt, ge, cap
