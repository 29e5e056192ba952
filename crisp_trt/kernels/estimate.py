"""estimate: per block vertical and slash mass of the last-query proxy map, never materialising L×n.

The window's L = cfg.window last queries against every key, split over chunks of CH key blocks so
long sequences fill the GPU (grid (NCH, H, S)):
  estimate_partial_kernel  per chunk, each row's max and sum of exp (log2 domain)      → part_m, part_l
  estimate_mass_kernel     merges the chunks' (max, sum), recomputes each [L, B] probability tile once:
                           column sums → vsum/vmax of that key block; its diagonals → atomic adds into
                           the per-offset slash mass s[o]. The tile is taken as [L, W] sub-tiles (W ≤ 64)
                           and each sub-tile's diagonals are read by one [L, W] gather at column
                           (i + e) mod W, split by wrap count, so nothing spills ([L, 2B] gathers did).
  slash_reduce_kernel      s[o] → ssum/smax per offset block
Semantics: reference.estimate (the last block's padding counts as zero mass). A chunk's window is its last
min(L, q_len) queries, at the sequence's last positions, against all kv_len keys. Sequences whose kv_len is
below dense_below are skipped (route marks them dense).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .bounds import chunk_bounds
from .launch import kernel


@triton.jit
def _chunk(cu_ptr, cu_k_ptr, chunk, dense_below, total, total_k, NCH, BLOCK: tl.constexpr):
    """This program's key-block chunk c, head h and sequence s of grid (NCH, H, S), the sequence's query start and
    count, key start and count (kv_len) and key blocks, and whether it is idle (a dense sequence, or one that
    ends before chunk c)."""
    c = tl.program_id(0)
    s = tl.program_id(2)
    q_start, q_len, k_start, n = chunk_bounds(cu_ptr, cu_k_ptr, s, total, total_k, NCH * chunk * BLOCK)
    nb = (n + BLOCK - 1) // BLOCK
    return c, tl.program_id(1), s, q_start, q_len, k_start, n, nb, (n < dense_below) | (c * chunk >= nb)


@triton.jit
def _window(q_ptr, q_start, q_len, n, h, sm_scale, H, L: tl.constexpr, D: tl.constexpr):
    """The window's queries (the chunk's last rows), their positions in the kv_len = n sequence and validity, and
    the log2-domain logit scale."""
    rows = tl.minimum(q_len, L)
    i = tl.arange(0, L)
    row_ok = i < rows
    r_pos = n - rows + i
    cols = tl.arange(0, D)
    q = tl.load(q_ptr + ((q_start + q_len - rows + i).to(tl.int64) * H + h)[:, None] * D + cols[None, :],
                mask=row_ok[:, None], other=0.0)
    return q, r_pos, row_ok, rows, sm_scale * 1.4426950408889634


@triton.jit
def _merge_stats(m, l, m_add, l_add):
    """Row (max, Σexp2) of two parts, where l_add = Σ exp2(x − m_add); safe for rows with no keys."""
    m_new = tl.maximum(m, m_add)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    return m_new, l * tl.exp2(m - m_safe) + l_add * tl.exp2(m_add - m_safe)


@triton.jit
def _logits(q, k_ptr, start, n, k_pos, r_pos, row_ok, hk, qk_scale, HK, D: tl.constexpr):
    """Masked log2-domain logits of the window rows against keys k_pos ([L, len(k_pos)])."""
    cols = tl.arange(0, D)
    key_ok = (k_pos >= 0) & (k_pos < n)
    off = ((start + k_pos).to(tl.int64) * HK + hk) * D
    k = tl.load(k_ptr + off[:, None] + cols[None, :], mask=key_ok[:, None], other=0.0)
    x = tl.dot(q, tl.trans(k)) * qk_scale
    ok = row_ok[:, None] & key_ok[None, :] & (k_pos[None, :] <= r_pos[:, None])
    return tl.where(ok, x, float("-inf"))


@kernel
def estimate_partial_kernel(q_ptr, k_ptr, cu_ptr, cu_k_ptr, part_m_ptr, part_l_ptr, sm_scale, chunk, dense_below,
                            total, total_k, H, G, NCH, L: tl.constexpr, BLOCK: tl.constexpr, D: tl.constexpr):
    c, h, s, q_start, q_len, start, n, nb, idle = _chunk(cu_ptr, cu_k_ptr, chunk, dense_below, total, total_k, NCH,
                                                         BLOCK)
    if idle:
        return
    q, r_pos, row_ok, rows, qk_scale = _window(q_ptr, q_start, q_len, n, h, sm_scale, H, L, D)
    m = tl.full([L], float("-inf"), tl.float32)
    l = tl.zeros([L], tl.float32)
    for kb in range(c * chunk, tl.minimum(nb, c * chunk + chunk)):
        x = _logits(q, k_ptr, start, n, kb * BLOCK + tl.arange(0, BLOCK), r_pos, row_ok, h // G, qk_scale, H // G, D)
        m_tile = tl.max(x, 1)
        l_tile = tl.sum(tl.exp2(x - tl.where(m_tile == float("-inf"), 0.0, m_tile)[:, None]), 1)
        m, l = _merge_stats(m, l, m_tile, l_tile)
    out = ((s * H + h) * NCH + c).to(tl.int64) * L + tl.arange(0, L)
    tl.store(part_m_ptr + out, m)
    tl.store(part_l_ptr + out, l)


@kernel
def estimate_mass_kernel(q_ptr, k_ptr, cu_ptr, cu_k_ptr, part_m_ptr, part_l_ptr, vsum_ptr, vmax_ptr, s_ptr, sm_scale,
                         chunk, dense_below, total, total_k, H, G, NB, NCH, L: tl.constexpr, BLOCK: tl.constexpr,
                         W: tl.constexpr, D: tl.constexpr):
    c, h, s, q_start, q_len, start, n, nb, idle = _chunk(cu_ptr, cu_k_ptr, chunk, dense_below, total, total_k, NCH,
                                                         BLOCK)
    if idle:
        return
    q, r_pos, row_ok, rows, qk_scale = _window(q_ptr, q_start, q_len, n, h, sm_scale, H, L, D)
    head = s * H + h
    m = tl.full([L], float("-inf"), tl.float32)
    l = tl.zeros([L], tl.float32)
    for j in range(0, (nb + chunk - 1) // chunk):  # merge the chunks' row statistics
        part = (head * NCH + j).to(tl.int64) * L + tl.arange(0, L)
        m, l = _merge_stats(m, l, tl.load(part_m_ptr + part), tl.load(part_l_ptr + part))
    m = tl.where(m == float("-inf"), 0.0, m)
    inv = tl.where(row_ok, 1.0 / tl.where(l > 0, l, 1.0), 0.0) / rows.to(tl.float32)
    i = tl.arange(0, L)[:, None]
    e = tl.arange(0, W)[None, :]
    out = head.to(tl.int64) * NB
    s_base = head.to(tl.int64) * NB * BLOCK
    for kb in range(c * chunk, tl.minimum(nb, c * chunk + chunk)):
        vsum = 0.0
        vmax = 0.0
        for half in tl.static_range(BLOCK // W):  # [L, W] sub-tiles keep the diagonal gather in registers
            k0 = kb * BLOCK + half * W
            x = _logits(q, k_ptr, start, n, k0 + tl.arange(0, W), r_pos, row_ok, h // G, qk_scale, H // G, D)
            p = tl.exp2(x - m[:, None]) * inv[:, None]
            col = tl.sum(p, 0)
            vsum += tl.sum(col, 0)
            vmax = tl.maximum(vmax, tl.max(col, 0))
            # row i, column (i + e) mod W lies on offset (n − rows + i) − (k0 + column) = base + W·w − e,
            # w = (i + e) // W: one masked column sum per wrap count w
            g = tl.gather(p, (i + e) % W, 1)
            for w in tl.static_range((L + W - 2) // W + 1):
                diag = tl.sum(tl.where((i + e) // W == w, g, 0.0), 0)
                o = n - rows - k0 + W * w - tl.arange(0, W)
                tl.atomic_add(s_ptr + s_base + o, diag, mask=(o >= 0) & (o < n) & (diag != 0.0), sem="relaxed")
        tl.store(vsum_ptr + out + kb, vsum)
        tl.store(vmax_ptr + out + kb, vmax)


@kernel
def slash_reduce_kernel(s_ptr, cu_ptr, cu_k_ptr, ssum_ptr, smax_ptr, dense_below, total, total_k, H, NB,
                        RB: tl.constexpr, BLOCK: tl.constexpr):
    g = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    n = chunk_bounds(cu_ptr, cu_k_ptr, s, total, total_k, NB * BLOCK)[3]
    nb = (n + BLOCK - 1) // BLOCK
    if (n < dense_below) | (g * RB >= nb):
        return
    ob = g * RB + tl.arange(0, RB)
    head = (s * H + h).to(tl.int64)
    x = tl.load(s_ptr + head * NB * BLOCK + ob[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :],
                mask=(ob < nb)[:, None], other=0.0)
    tl.store(ssum_ptr + head * NB + ob, tl.sum(x, 1), mask=ob < nb)
    tl.store(smax_ptr + head * NB + ob, tl.max(x, 1), mask=ob < nb)
