"""estimate: per block vertical and slash mass of the last-query proxy map, never materialising L×n.

One program per (head, sequence), over the window of L = cfg.window last queries:
pass 1 gets each row's max and sum of exp over all (causal) keys; pass 2 recomputes each key block's
[L, B] probabilities and reduces the column means to vsum/vmax; the slash pass computes, per offset
block ob, the [L, 2B] probability tile of keys j0 .. j0+2B (j0 = n-rows-ob·B-B+1) and extracts the
B diagonals o = ob·B + t with tl.gather (column i - t + B - 1 of row i), reduced to ssum/smax.
Semantics: reference.estimate (padding of the last block counts as zero mass).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _logits(q, k_ptr, start, n, k_pos, r_pos, row_ok, hk, qk_scale, HK: tl.constexpr, D: tl.constexpr):
    """Masked log2-domain logits of the window rows against keys k_pos ([L, len(k_pos)])."""
    cols = tl.arange(0, D)
    key_ok = (k_pos >= 0) & (k_pos < n)
    off = ((start + k_pos).to(tl.int64) * HK + hk) * D
    k = tl.load(k_ptr + off[:, None] + cols[None, :], mask=key_ok[:, None], other=0.0)
    s = tl.dot(q, tl.trans(k)) * qk_scale
    ok = row_ok[:, None] & key_ok[None, :] & (k_pos[None, :] <= r_pos[:, None])
    return tl.where(ok, s, float("-inf")), ok


@triton.jit
def estimate_kernel(q_ptr, k_ptr, cu_ptr, vsum_ptr, vmax_ptr, ssum_ptr, smax_ptr, sm_scale,
                    H: tl.constexpr, G: tl.constexpr, NB: tl.constexpr, L: tl.constexpr,
                    BLOCK: tl.constexpr, D: tl.constexpr):
    h = tl.program_id(0)
    s = tl.program_id(1)
    start = tl.load(cu_ptr + s)
    n = tl.load(cu_ptr + s + 1) - start
    HK: tl.constexpr = H // G
    hk = h // G
    rows = tl.minimum(n, L)
    i = tl.arange(0, L)
    row_ok = i < rows
    r_pos = n - rows + i
    cols = tl.arange(0, D)
    q_off = ((start + r_pos).to(tl.int64) * H + h) * D
    q = tl.load(q_ptr + q_off[:, None] + cols[None, :], mask=row_ok[:, None], other=0.0)
    qk_scale = sm_scale * 1.4426950408889634
    nb = (n + BLOCK - 1) // BLOCK
    m = tl.full([L], float("-inf"), tl.float32)
    l = tl.zeros([L], tl.float32)
    kb = 0
    while kb < nb:  # pass 1: row max and sum
        x, ok = _logits(q, k_ptr, start, n, kb * BLOCK + tl.arange(0, BLOCK), r_pos, row_ok, hk, qk_scale, HK, D)
        m_new = tl.maximum(m, tl.max(x, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        l = l * tl.exp2(tl.where(m == float("-inf"), float("-inf"), m - m_safe)) + tl.sum(tl.exp2(x - m_safe[:, None]), 1)
        m = m_new
        kb += 1
    m = tl.where(m == float("-inf"), 0.0, m)
    inv = tl.where(row_ok, 1.0 / tl.where(l > 0, l, 1.0), 0.0) / rows.to(tl.float32)
    out = (s * H + h) * NB
    kb = 0
    while kb < nb:  # pass 2: vertical mass per key block
        x, ok = _logits(q, k_ptr, start, n, kb * BLOCK + tl.arange(0, BLOCK), r_pos, row_ok, hk, qk_scale, HK, D)
        col = tl.sum(tl.exp2(x - m[:, None]) * inv[:, None], 0)
        tl.store(vsum_ptr + out + kb, tl.sum(col, 0))
        tl.store(vmax_ptr + out + kb, tl.max(col, 0))
        kb += 1
    t = tl.arange(0, BLOCK)
    diag = i[:, None] - t[None, :] + BLOCK - 1  # [L, B] column of offset t in row i's 2B tile
    ob = 0
    while ob < nb:  # slash mass per offset block
        j0 = n - rows - ob * BLOCK - BLOCK + 1
        x, ok = _logits(q, k_ptr, start, n, j0 + tl.arange(0, 2 * BLOCK), r_pos, row_ok, hk, qk_scale, HK, D)
        p = tl.exp2(x - m[:, None]) * inv[:, None]
        per_offset = tl.sum(tl.gather(p, diag, 1), 0)
        tl.store(ssum_ptr + out + ob, tl.sum(per_offset, 0))
        tl.store(smax_ptr + out + ob, tl.max(per_offset, 0))
        ob += 1


def estimate(q: torch.Tensor, k: torch.Tensor, cu_seqlens: torch.Tensor, nb: int, block: int, window: int):
    """Launch estimate: (vsum, vmax, ssum, smax), each f32 [S, H, nb], zero past a sequence's blocks.
    Grid (H, S)."""
    heads, d = q.shape[1], q.shape[2]
    seqs = cu_seqlens.shape[0] - 1
    bufs = [torch.zeros(seqs, heads, nb, dtype=torch.float32, device=q.device) for _ in range(4)]
    estimate_kernel[(heads, seqs)](q, k, cu_seqlens, *bufs, 1.0 / math.sqrt(d), H=heads, G=heads // k.shape[1],
                                   NB=nb, L=window, BLOCK=block, D=d, num_warps=4)
    return tuple(bufs)
