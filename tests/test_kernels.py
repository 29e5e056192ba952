"""Kernels against the reference (TRITON_INTERPRET=1 on CPU): attend with the reference's masks."""
import pytest
import torch

from crisp_trt import CrispConfig, reference
from crisp_trt.kernels.attend import attend
from crisp_trt.kernels.pipeline import lists_from_masks
from crisp_trt.workloads.synthetic import synthetic_qkv


def _rel(a, b):
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm())


def _random_masks(heads, nb, seed):
    g = torch.Generator().manual_seed(seed)
    m = (torch.rand(heads, nb, nb, generator=g) < 0.4).tril()
    return m | torch.eye(nb, dtype=torch.bool)


def _run_attend(device, lens, heads, kv_heads, d, dtype, block=64, dense_seq=()):
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    total, nqb = int(cu[-1]), max(reference.num_blocks(n, block) for n in lens)
    q, k, v = (t[0].to(dtype) for t in synthetic_qkv(total, heads, kv_heads, d, seed=1))
    masks = [reference.causal_block_mask(n, heads, block) if i in dense_seq
             else _random_masks(heads, reference.num_blocks(n, block), i) for i, n in enumerate(lens)]
    idx, counts = lists_from_masks(masks, nqb, nqb)
    dense = torch.tensor([int(i in dense_seq) for i in range(len(lens))], dtype=torch.int32)
    out = torch.full_like(q, float("nan"))  # poisoned: every element must be written
    args = [t.to(device) for t in (q, k, v, cu, idx, counts, dense)]
    got = attend(*args, block=block, out=out.to(device)).cpu()
    for i, n in enumerate(lens):
        a, b = int(cu[i]), int(cu[i + 1])
        if n == 0:
            continue
        want = reference.attend(q[a:b], k[a:b], v[a:b], masks[i], block)
        assert torch.isfinite(got[a:b]).all()
        assert _rel(got[a:b], want) < 1e-2


@pytest.mark.parametrize("heads,kv_heads,d,dtype", [
    (4, 2, 64, torch.float16), (4, 4, 64, torch.bfloat16), (4, 2, 128, torch.bfloat16),
    (2, 1, 256, torch.float16)])
def test_attend_matches_reference(device, heads, kv_heads, d, dtype):
    if device == "cpu" and dtype == torch.bfloat16:
        pytest.skip("bf16 gives garbage in the Triton 3.6 interpreter (numpy has no bf16); checked on GPU")
    _run_attend(device, [330], heads, kv_heads, d, dtype)


def test_attend_varlen_and_dense(device):
    _run_attend(device, [200, 0, 450, 64], 4, 2, 64, torch.float16, dense_seq=(2,))


@pytest.mark.parametrize("lens,window", [([330], 64), ([150, 40, 260], 32)])
def test_estimate_matches_reference(device, lens, window):
    from crisp_trt.kernels.estimate import estimate

    cfg = CrispConfig(block_size=64, last_q=window)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    nb = max(reference.num_blocks(n, 64) for n in lens)
    q, k, _ = (t[0].half() for t in synthetic_qkv(int(cu[-1]), 4, 2, 64, seed=2))
    got = estimate(q.to(device), k.to(device), cu.to(device), nb, 64, window)
    for s, n in enumerate(lens):
        a, b = int(cu[s]), int(cu[s + 1])
        want = reference.estimate(q[a:b].float(), k[a:b].float(), cfg)
        m = reference.num_blocks(n, 64)
        for g, w in zip(got, (want.vsum, want.vmax, want.ssum, want.smax)):
            assert torch.allclose(g[s, :, :m].cpu(), w, atol=2e-3, rtol=2e-2)


def test_crisp_cuda_dense_and_poison(device):
    from crisp_trt.kernels.pipeline import crisp_cuda

    q, k, v = (t[0].half().to(device) for t in synthetic_qkv(300, 4, 2, 64, seed=3))
    cu = torch.tensor([0, 120, 300], dtype=torch.int32, device=device)
    cfg = CrispConfig(block_size=64)
    out, route, c_struct, dens = crisp_cuda(q, k, v, cu, 180, cfg)
    for a, b in ((0, 120), (120, 300)):
        want = reference.dense_attention(q[a:b].cpu(), k[a:b].cpu(), v[a:b].cpu())
        assert _rel(out[a:b].cpu(), want) < 1e-2
    assert route.shape == (2, 4) and bool((dens == 1).all())
    k[7, 1, 3] = float("nan")
    assert torch.isnan(crisp_cuda(q, k, v, cu, 180, cfg)[0]).all()
    k[7, 1, 3] = 0.0
    bad = torch.tensor([0, 200, 120], dtype=torch.int32, device=device)
    assert torch.isnan(crisp_cuda(q, k, v, bad, 200, cfg)[0]).all()
