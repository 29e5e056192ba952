"""A one-pass rows stage (prototype, timed by rows_variants.py beside the shipped two-pass rows_kernel).

The shipped kernel reads every key twice: pass 1 for each sampled row's max and Σexp2, pass 2 for each key block's
share. Here one pass keeps, per row and key block, the block's log2-sum-exp2 L[r, kb] = m_r(kb) + log2 Σ exp2(x −
m_r(kb)) (m_r(kb): the running max when the block was read) in a per-program slot [NB, RM] f32, and a short second
loop turns them into shares, exp2(L[r, kb] − lse_r), summed over each query block's rows — half the exponentials.
Persistent grid: `programs` programs each own one slot and walk the tiles (g, h, s) latest-first. Run as a script
under TRITON_INTERPRET=1 it checks the scratch against reference.rows_mass.
"""
from __future__ import annotations

import triton
import triton.language as tl

from crisp_trt.kernels.bounds import chunk_bounds
from crisp_trt.kernels.launch import kernel
from crisp_trt.kernels.rows import _logits

KC = 16  # key blocks a normalisation step


@triton.jit
def _blocks_lse(m, l, slot, q, k_ptr, k_start, lo, hi, pos, last, qk_scale, hk, HK, BLOCK: tl.constexpr,
                D: tl.constexpr, RM: tl.constexpr, MASKED: tl.constexpr):
    """Key blocks [lo, hi): the running max / Σexp2 of each row, and each block's log2-sum-exp2 into slot[kb]."""
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
def rows_onepass_kernel(q_ptr, k_ptr, cu_ptr, cu_k_ptr, route_ptr, scratch_ptr, slots_ptr, sm_scale, dense_below,
                        total, total_k, H, G, NB, BLOCK: tl.constexpr, D: tl.constexpr, R: tl.constexpr,
                        RM: tl.constexpr, KC: tl.constexpr):
    S = tl.num_programs(1)
    slot = slots_ptr + tl.program_id(0).to(tl.int64) * NB * RM
    ng = (NB * R + RM - 1) // RM  # tiles per (sequence, head)
    t = tl.arange(0, RM)
    d = tl.arange(0, D)
    qk_scale = sm_scale * 1.4426950408889634
    for tile in range(tl.program_id(0), ng * H * S, tl.num_programs(0)):
        g = ng - 1 - tile // (H * S)  # the latest query blocks (the most keys) first
        h = tile % H
        s = (tile // H) % S
        q_start, q_len, k_start, n = chunk_bounds(cu_ptr, cu_k_ptr, s, total, total_k, NB * BLOCK)
        first = n - q_len
        qb_lo = g * (RM // R)
        todo = (n >= dense_below) & (qb_lo * BLOCK < n) & ((qb_lo + RM // R) * BLOCK > first)
        if todo:
            todo = tl.load(route_ptr + s * H + h) == 2
        if todo:
            qb = qb_lo + t // R
            pos = tl.minimum(tl.maximum(qb * BLOCK + (BLOCK // R) * (t % R + 1) - 1, first), n - 1)
            q = tl.load(q_ptr + ((q_start - first + pos).to(tl.int64) * H + h)[:, None] * D + d[None, :])
            hk, HK = h // G, H // G
            last = tl.max(pos, 0)
            top = last // BLOCK + 1
            m, l = _blocks_lse(tl.full([RM], float("-inf"), tl.float32), tl.zeros([RM], tl.float32), slot, q, k_ptr,
                               k_start, 0, qb_lo, pos, last, qk_scale, hk, HK, BLOCK, D, RM, False)
            m, l = _blocks_lse(m, l, slot, q, k_ptr, k_start, qb_lo, top, pos, last, qk_scale, hk, HK, BLOCK, D, RM,
                               True)
            lse = m + tl.log2(l)
            tl.debug_barrier()  # the slot's stores before its loads
            blocks = qb_lo + tl.arange(0, RM // R)
            ok = (blocks * BLOCK < n) & (blocks * BLOCK + BLOCK > first)
            out = scratch_ptr + ((s * H + h).to(tl.int64) * NB + blocks) * NB
            for kb0 in range(0, top, KC):
                kb = kb0 + tl.arange(0, KC)
                share = tl.exp2(tl.load(slot + kb[:, None] * RM + t[None, :], mask=(kb < top)[:, None],
                                        other=float("-inf")) - lse[None, :]) / R
                mass = tl.sum(tl.reshape(share, (KC, RM // R, R)), 2)
                tl.store(out[None, :] + kb[:, None], mass, mask=ok[None, :] & (kb[:, None] <= blocks[None, :]))
            tl.debug_barrier()  # the slot's loads before the next tile's stores


def launch(q, k, cu, cu_k, route, scratch, slots, sm_scale, dense_below, nb, heads, groups, block, d, r, rm,
           programs, **options):
    """One launch over every tile with `programs` persistent programs (slots: [programs, nb, rm] f32)."""
    seqs = cu.shape[0] - 1
    rows_onepass_kernel[(programs, seqs, 1)](q, k, cu, cu_k, route, scratch, slots, sm_scale, dense_below,
                                             q.shape[0], k.shape[0], heads, groups, nb, BLOCK=block, D=d, R=r, RM=rm,
                                             KC=KC, **options)


def _check() -> None:
    """Under the interpreter: the scratch equals reference.rows_mass (chunks, an empty and a short sequence)."""
    import math

    import torch

    from crisp_trt import CrispConfig, reference
    from crisp_trt.workloads.synthetic import synthetic_qkv

    for lens_q, lens_k, r, block, heads, programs in (([900], [900], 16, 64, 4, 3),
                                                      ([400, 37, 0, 50], [900, 300, 100, 50], 32, 64, 4, 5),
                                                      ([129, 700], [1000, 700], 64, 128, 6, 7)):
        cfg = CrispConfig(block_size=block, dense_below=60, tau=1.5, rows=r, spike=0.0)
        cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
        cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
        whole, k, _ = (t[0] for t in synthetic_qkv(int(cu_k[-1]), heads, 2, 64, seed=3))
        q = torch.cat([whole[int(end) - n: int(end)] for n, end in zip(lens_q, cu_k[1:])])
        nb = -(-max(lens_k) // block)
        scratch = torch.zeros(len(lens_q), heads, nb, nb)
        slots = torch.zeros(programs, nb, 128)
        route = torch.full((len(lens_q), heads), 2, dtype=torch.int32)
        launch(q, k, cu_q, cu_k, route, scratch, slots, 1 / math.sqrt(64), 60, nb, heads, heads // 2, block, 64, r,
               128, programs)
        checked = 0
        for s, (ql, kl) in enumerate(zip(lens_q, lens_k)):
            if ql == 0 or kl < 60:
                continue
            qa, ka = int(cu_q[s]), int(cu_k[s])
            want = reference.rows_mass(q[qa:qa + ql], k[ka:ka + kl], cfg)
            for h in range(heads):
                for qb in range((kl - ql) // block, reference.num_blocks(kl, block)):
                    got = scratch[s, h, qb, :qb + 1]
                    assert torch.isfinite(got).all() and torch.allclose(got, want[h, qb, :qb + 1], atol=1e-5), \
                        (lens_q, s, h, qb, (got - want[h, qb, :qb + 1]).abs().max())
                    checked += 1
        print(f"lens {lens_q} of {lens_k}, R {r}, B {block}, {programs} programs: {checked} rows equal rows_mass")


if __name__ == "__main__":
    _check()
