"""bisect's order statistics against torch on awkward rows, for every probe count P (kernels/bisect.py).

The searches must land on the exact f32 the reference's sort finds (kthvalue; sort + cumsum for the
mass threshold), whatever P, on rows with duplicates, zeros, subnormals and a wide range."""
from __future__ import annotations

import os

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from crisp_trt.kernels.bisect import INF_BITS, kth_smallest, mass_threshold, search_steps  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
pytestmark = pytest.mark.skipif(DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1",
                                reason="Triton kernels need a GPU or TRITON_INTERPRET=1")
R, N, C = 4, 100, 32  # rows, entries a row (not a multiple of C), chunk


@triton.jit
def _order_kernel(x_ptr, k_ptr, need_ptr, kth_ptr, reach_ptr, N, R: tl.constexpr, C: tl.constexpr,
                  P: tl.constexpr):
    r = tl.arange(0, R)
    base = (r * N).to(tl.int64)
    lo = tl.zeros([R], tl.int32)
    m = lo + N
    none = lo - 1
    one = tl.zeros([R], tl.float32) + 1.0
    tl.store(kth_ptr + r, kth_smallest(x_ptr, base, lo, m, m, tl.load(k_ptr + r), none, one, 1.0, C, P))
    tl.store(reach_ptr + r, mass_threshold(x_ptr, base, lo, m, m, tl.load(need_ptr + r), none, one, 1.0, C, P))


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


@pytest.mark.parametrize("P", [1, 2, 4, 8, 16])
def test_searches_find_the_reference_value_for_every_probe_count(P):
    gen = torch.Generator().manual_seed(P)
    x = _rows(gen)
    k = torch.randint(0, N, (R,), generator=gen, dtype=torch.int32)
    desc = x.double().sort(1, descending=True).values
    sums = desc.cumsum(1)
    need = torch.zeros(R)
    for r in range(R):  # half way through an entry that moves the sum by ≥ 0.1 %: far from f32's rounding
        cuts = (desc[r] >= 1e-3 * sums[r]).nonzero()[:, 0]
        i = int(cuts[torch.randint(0, len(cuts), (1,), generator=gen)])
        need[r] = float(sums[r, i] - desc[r, i] / 2)
    need[1] = 2 * float(x[1].sum())  # unreachable: 0
    kth, reach = torch.full((R,), -1.0), torch.full((R,), -1.0)
    args = [t.to(DEVICE) for t in (x, k, need, kth, reach)]
    _order_kernel[(1,)](*args, N, R=R, C=C, P=P)
    kth, reach = args[3].cpu(), args[4].cpu()
    want_kth = x.sort(1).values.gather(1, k[:, None].long())[:, 0]
    assert torch.equal(kth, want_kth), (kth, want_kth)
    want_reach = torch.tensor([_reach(x[r], float(need[r])) for r in range(R)])
    assert torch.equal(reach, want_reach.float()), (reach, want_reach)
    assert reach[1] == 0.0


def _worst_steps(P: int) -> int:
    """Steps until [0, +inf]'s bit patterns narrow to one, each step leaving the widest part probes() can leave."""
    w, steps = INF_BITS.value + 1, 0
    while w > 1:
        part = (w + P) // (P + 1)
        w, steps = max(part, w - P * part), steps + 1
    return steps


@pytest.mark.parametrize("P", [1, 2, 4, 8, 16])
def test_search_steps_cover_the_widest_interval(P):
    out = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    _steps_kernel[(1,)](out, P=P)
    assert int(out[0]) == _worst_steps(P)
