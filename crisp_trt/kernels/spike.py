"""spike: select's per-row detector of far key blocks (CrispConfig.spike; reference.spike_mass).

Grid (NB, H, S): program (qb, h, s) takes the chunk's rows in query block qb of head h, and per row the softmax
over key blocks j ≤ qb of q_i · k̄_j · scale against the pooled keys (pool's means rounded to q's dtype,
pooled_k_in: 16-bit dot operands run at twice tf32's rate on half its bytes; one tensor-core tile per KC key
blocks, f32 accumulation; two passes: row max and sum, then each share's log against log(spike)). It writes
spikes[s, h, qb, kb] = 1 for every earlier block kb < qb some row gives more than `spike`, 0 for the others;
select adds them to the lists.
Cost ≈ 2/B of dense attention's.
"""
from __future__ import annotations

import triton.language as tl

from .bounds import chunk_bounds
from .launch import kernel


@kernel
def spike_kernel(q_ptr, cu_ptr, cu_k_ptr, pk_in_ptr, spk_ptr, sm_scale, spike, dense_below, total, total_k, H, G,
                 NB, BLOCK: tl.constexpr, D: tl.constexpr, KC: tl.constexpr):
    qb = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    q_start, q_len, _, n = chunk_bounds(cu_ptr, cu_k_ptr, s, total, total_k, NB * BLOCK)
    first = n - q_len
    if (n < dense_below) | (qb * BLOCK >= n) | (qb * BLOCK + BLOCK <= first):
        return
    pos = qb * BLOCK + tl.arange(0, BLOCK)
    valid = (pos >= first) & (pos < n)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + ((q_start - first + pos).to(tl.int64) * H + h)[:, None] * D + d[None, :],
                mask=valid[:, None], other=0.0)
    HK = H // G
    k_rows = (s * NB).to(tl.int64) * HK + h // G
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK], tl.float32)
    for kb0 in range(0, qb + 1, KC):  # row max and sum over the key blocks j ≤ qb
        kb = kb0 + tl.arange(0, KC)
        pk = tl.load(pk_in_ptr + (k_rows + kb * HK)[:, None] * D + d[None, :], mask=(kb <= qb)[:, None], other=0.0)
        z = tl.dot(q, tl.trans(pk)) * sm_scale
        z = tl.where((kb <= qb)[None, :], z, float("-inf"))
        m_new = tl.maximum(m, tl.max(z, 1))
        l = l * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new[:, None]), 1)
        m = m_new
    lse = m + tl.log(l)  # share exp(z − lse) > spike ⟺ z − lse > log(spike): the second pass needs no exp
    log_spike = tl.log(spike)
    out = spk_ptr + ((s * H + h).to(tl.int64) * NB + qb) * NB
    for kb0 in range(0, qb, KC):  # each earlier block's largest log-share over the rows
        kb = kb0 + tl.arange(0, KC)
        pk = tl.load(pk_in_ptr + (k_rows + kb * HK)[:, None] * D + d[None, :], mask=(kb < qb)[:, None], other=0.0)
        z = tl.dot(q, tl.trans(pk)) * sm_scale - lse[:, None]
        z = tl.where(valid[:, None] & (kb < qb)[None, :], z, float("-inf"))
        tl.store(out + kb, (tl.max(z, 0) > log_spike).to(tl.int8), mask=kb < qb)
