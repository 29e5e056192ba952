"""The public op on CPU: layouts, varlen, stats, torch.library registration, and every bad input."""
import json

import pytest
import torch

from crisp_trt import CrispConfig, crisp_prefill_attention, dense_prefill_attention
from crisp_trt.api import _prefill_attention

CFG = CrispConfig(block_size=64, dense_below=0)


def _qkv(b=1, n=200, h=4, hk=2, d=32, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, n, x, d, generator=g).to(dtype) for x in (h, hk, hk))


def test_batch_and_packed_agree_with_stats():
    q, k, v = _qkv(b=2, n=260)
    out, stats = crisp_prefill_attention(q, k, v, config=CFG, return_stats=True)
    assert out.shape == q.shape and out.dtype == q.dtype and torch.isfinite(out).all()
    assert stats.density.shape == (2, 4) and stats["density"] is stats.density
    assert 0 < stats.mean_density <= 1 and stats.route_names()[0][0] in ("vertical_slash", "block_sparse")
    cu = torch.tensor([0, 260, 520], dtype=torch.int32)
    packed = crisp_prefill_attention(q.reshape(520, 4, 32), k.reshape(520, 2, 32), v.reshape(520, 2, 32),
                                     config=CFG, cu_seqlens=cu)
    assert torch.equal(packed.reshape(2, 260, 4, 32), out)


def test_varlen_each_sequence_independent():
    q, k, v = _qkv(n=500)
    q, k, v = q[0], k[0], v[0]
    cu = torch.tensor([0, 130, 130, 500], dtype=torch.int32)  # includes an empty sequence
    out = crisp_prefill_attention(q, k, v, config=CFG, cu_seqlens=cu)
    first = crisp_prefill_attention(q[:130], k[:130], v[:130], config=CFG)
    second = crisp_prefill_attention(q[130:], k[130:], v[130:], config=CFG)
    assert torch.equal(out[:130], first) and torch.equal(out[130:], second)


def test_dense_helper_and_opcheck():
    q, k, v = _qkv(n=150)
    ref = dense_prefill_attention(q, k, v)
    keep_all = CrispConfig(block_size=64, kappa=0.0, dense_below=0, max_budget=1 << 20)
    assert float((crisp_prefill_attention(q, k, v, config=keep_all) - ref).norm() / ref.norm()) < 1e-3
    cu = torch.tensor([0, 150], dtype=torch.int32)
    torch.library.opcheck(_prefill_attention, (q[0], k[0], v[0], cu, 150, json.dumps(CFG.to_dict())))


@pytest.mark.parametrize("where", ["q", "k", "v"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_input_never_gives_finite_output(where, value):
    q, k, v = _qkv(n=300)
    t = {"q": q, "k": k, "v": v}[where]
    t[0, 7, 0, 3] = value  # a key that the sparse selection may well skip
    out = crisp_prefill_attention(q, k, v, config=CFG)
    assert not torch.isfinite(out).all()


def _bad(**changes):
    q, k, v = _qkv()
    args = dict(q=q, k=k, v=v, config=CFG, cu_seqlens=None)
    args.update(changes)
    return args


@pytest.mark.parametrize("args, error, pattern", [
    (_bad(q=torch.randn(4, 32)), ValueError, "q.shape"),
    (_bad(q=torch.randn(1, 1, 200, 4, 32)), ValueError, "q.shape"),
    (_bad(k=torch.randn(1, 200, 2, 32)[0]), ValueError, "k.shape"),
    (_bad(k=torch.randn(1, 200, 3, 32), v=torch.randn(1, 200, 3, 32)), ValueError, "multiple of H_kv"),
    (_bad(v=torch.randn(1, 200, 1, 32)), ValueError, "v.shape"),
    (_bad(k=torch.randn(1, 200, 2, 16)), ValueError, "head_dim"),
    (_bad(q=torch.randn(1, 200, 4, 512), k=torch.randn(1, 200, 2, 512), v=torch.randn(1, 200, 2, 512)),
     ValueError, "head_dim"),
    (_bad(k=torch.randn(1, 199, 2, 32)), ValueError, "k.shape"),
    (_bad(q=torch.ones(1, 200, 4, 32, dtype=torch.int32)), TypeError, "q.dtype"),
    (_bad(v=torch.randn(1, 200, 2, 32, dtype=torch.float64)), TypeError, "v.dtype"),
    (_bad(q=torch.randn(1, 200, 4, 32, device="meta")), ValueError, "device"),
    (_bad(config={"kappa": 1}), TypeError, "config"),
    (_bad(q="q"), TypeError, "q"),
    (_bad(q=torch.randn(1, 0, 4, 32), k=torch.randn(1, 0, 2, 32), v=torch.randn(1, 0, 2, 32)), ValueError, "token"),
])
def test_bad_input_named(args, error, pattern):
    with pytest.raises(error, match=pattern):
        crisp_prefill_attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)


@pytest.mark.parametrize("cu, error, pattern", [
    ([0, 100, 50, 200], ValueError, "non-decreasing"),
    ([1, 200], ValueError, r"cu_seqlens\[0\]"),
    ([0, 150], ValueError, r"cu_seqlens\[-1\]"),
    ([0], ValueError, "cu_seqlens.shape"),
    ("0,200", TypeError, "cu_seqlens"),
])
def test_bad_cu_seqlens(cu, error, pattern):
    q, k, v = (t[0] for t in _qkv())
    cu_t = torch.tensor(cu, dtype=torch.int32) if isinstance(cu, list) else cu
    with pytest.raises(error, match=pattern):
        crisp_prefill_attention(q, k, v, config=CFG, cu_seqlens=cu_t)
    if isinstance(cu, list):
        with pytest.raises(TypeError, match="cu_seqlens.dtype"):
            crisp_prefill_attention(q, k, v, config=CFG, cu_seqlens=cu_t.float())
