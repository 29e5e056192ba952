"""bisect's order statistics against torch on awkward rows, for every probe count P (kernels/bisect.py).

The searches must land on the exact f32 the reference's sort finds (kthvalue; sort + cumsum for the
mass threshold), whatever P, on rows with duplicates, zeros, subnormals and a wide range."""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from crisp_trt.kernels.bisect import INF_BITS, kth_smallest, mass_threshold, search_steps

R, N, C = 4, 100, 32  # rows, entries a row (not a multiple of C), chunk


@triton.jit
def _order_kernel(x_ptr, lo_ptr, m_ptr, cnt_ptr, k_ptr, need_ptr, kth_ptr, reach_ptr, N, R: tl.constexpr,
                  C: tl.constexpr, P: tl.constexpr):
    r = tl.arange(0, R)
    base = (r * N).to(tl.int64)
    lo, m, cnt = tl.load(lo_ptr + r), tl.load(m_ptr + r), tl.load(cnt_ptr + r)
    none = lo * 0 - 1
    one = tl.zeros([R], tl.float32) + 1.0
    tl.store(kth_ptr + r, kth_smallest(x_ptr, base, lo, m, cnt, tl.load(k_ptr + r), none, one, 1.0, C, P))
    tl.store(reach_ptr + r, mass_threshold(x_ptr, base, lo, m, cnt, tl.load(need_ptr + r), none, one, 1.0, C, P))


@triton.jit
def _steps_kernel(out_ptr, P: tl.constexpr):
    tl.store(out_ptr, search_steps(P))


def _rows(gen: torch.Generator) -> torch.Tensor:
    x = torch.rand(R, N, generator=gen) ** 8  # mass piled near 0
    x[0, :40] = x[0, 40:80]  # duplicates
    x[1, ::7] = 0.0
    x[2, :10] = torch.tensor(1e-40)  # subnormal
    x[3] = torch.exp(torch.randn(N, generator=gen) * 20).clamp(max=1e30)  # a wide range
    return x


def _reach(row: torch.Tensor, need: float) -> float:
    """The largest t with Σ{x ≥ t} x ≥ need (0 when the whole row falls short)."""
    desc = row.double().sort(descending=True).values
    hit = (desc.cumsum(0) >= need).nonzero()
    return float(desc[hit[0, 0]]) if len(hit) else 0.0


# each row's entries: lo, m (a range of the row) and cnt (≤ m: a strided sample of it, as the noise floor takes)
LO, M, CNT = [0, 5, 20, 0], [100, 90, 64, 100], [100, 90, 17, 100]


@pytest.mark.parametrize("P", [1, 2, 4, 8, 16])
def test_searches_find_the_reference_value_for_every_probe_count(device, P):
    gen = torch.Generator().manual_seed(P)
    x = _rows(gen)
    entries = [x[r, [lo + t * m // cnt for t in range(cnt)]] for r, (lo, m, cnt) in enumerate(zip(LO, M, CNT))]
    k = torch.tensor([int(torch.randint(0, len(e), (1,), generator=gen)) for e in entries], dtype=torch.int32)
    k[2] = CNT[2]  # past the last entry: +inf
    need = torch.zeros(R)
    for r, e in enumerate(entries):  # half way through an entry that moves the sum by ≥ 0.1 %: far from f32 rounding
        desc = e.double().sort(descending=True).values
        sums = desc.cumsum(0)
        cuts = (desc >= 1e-3 * sums).nonzero()[:, 0]
        i = int(cuts[torch.randint(0, len(cuts), (1,), generator=gen)])
        need[r] = float(sums[i] - desc[i] / 2)
    need[1] = 2 * float(entries[1].sum())  # unreachable: 0
    kth, reach = torch.full((R,), -1.0), torch.full((R,), -1.0)
    bounds = [torch.tensor(v, dtype=torch.int32) for v in (LO, M, CNT)]
    args = [t.to(device) for t in (x, *bounds, k, need, kth, reach)]
    _order_kernel[(1,)](*args, N, R=R, C=C, P=P)
    kth, reach = args[-2].cpu(), args[-1].cpu()
    want_kth = torch.tensor([float(e.sort().values[i]) if i < len(e) else float("inf") for e, i in zip(entries, k)])
    assert torch.equal(kth, want_kth), (kth, want_kth)
    want_reach = torch.tensor([_reach(e, float(n)) for e, n in zip(entries, need)])
    assert torch.equal(reach, want_reach.float()), (reach, want_reach)


def _worst_steps(P: int) -> int:
    """Steps until [0, +inf]'s bit patterns narrow to one, each step leaving the widest part probes() can leave
    (the smallest-true search; the largest-true one, narrowing INF_BITS patterns to none, takes as many)."""
    w, steps = INF_BITS.value + 1, 0
    while w > 1:
        part = (w + P) // (P + 1)
        w, steps = max(part, w - P * part), steps + 1
    return steps


@pytest.mark.parametrize("P", [1, 2, 4, 8, 16])
def test_search_steps_cover_the_widest_interval(device, P):
    out = torch.zeros(1, dtype=torch.int32, device=device)
    _steps_kernel[(1,)](out, P=P)
    assert int(out[0]) == _worst_steps(P)
