"""Block-mass estimates (bench.estimators) against definitions written out by hand, and the coverage selection
with an estimate inside the whole-model oracle."""
import math

import pytest
import torch

from crisp_trt import reference
from crisp_trt.bench.estimators import antidiagonal_mass, coverage_keep, estimated_mass, parse
from crisp_trt.bench.oracle import BlockOracle, oracle_attention
from crisp_trt.reference import dense_rows
from crisp_trt.workloads.synthetic import SyntheticSpec, synthetic_qkv

BLOCK = 32


def qk(n=256, heads=2, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(heads, n, d, generator=g), 2 * torch.randn(heads, n, d, generator=g)


def exact(q, k, first):
    pos = torch.arange(k.shape[-2])
    return dense_rows(q, k, pos[None] > pos[first:first + q.shape[-2], None], BLOCK)[1]


@pytest.mark.parametrize("first", [0, 64])
def test_antidiagonal_by_hand(first):
    q, k = qk()
    rows, stride = q[:, first:first + 96], 4
    got = antidiagonal_mass(rows, k[:, :first + 96], first, BLOCK, stride)
    heads, n, d = 2, first + 96, 16
    want = torch.zeros(heads, 3, -(-n // BLOCK))
    for h in range(heads):
        for g in range(96 // stride):
            ga = first // stride + g  # the group's absolute index
            s = torch.tensor([sum(float(rows[h, g * stride + i] @ k[h, j * stride + stride - 1 - i])
                                  for i in range(stride)) for j in range(ga + 1)]) / (math.sqrt(d) * stride)
            p = torch.softmax(s, 0)
            for j in range(ga + 1):
                want[h, g * stride // BLOCK, j * stride // BLOCK] += p[j]
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


def test_stride_one_and_every_row_are_exact():
    q, k = qk(n=200)  # a partial last block
    mass = exact(q, k, 0)
    want = estimated_mass("exact", q, k, 0, BLOCK, mass)
    assert want.shape == (2, 7, 7) and torch.allclose(want.sum(-1), torch.tensor([32.0] * 6 + [8.0]).expand(2, 7))
    assert torch.allclose(estimated_mass("antidiag1", q, k, 0, BLOCK, mass), want, atol=1e-4)
    rows = estimated_mass(f"rows{BLOCK}", q, k, 0, BLOCK, mass)
    assert torch.allclose(rows[:, :6], want[:, :6], atol=1e-4)  # whole blocks: every row once
    partial = mass[:, 192:].sum(1) + 24 * mass[:, 199]  # the partial block repeats its last row (sampled_rows)
    assert torch.allclose(rows[:, 6], partial, atol=1e-4)


def test_rows_reads_the_strided_rows():
    q, k = qk()
    mass = exact(q, k, 0)
    got = estimated_mass("rows4", q, k, 0, BLOCK, mass)
    picked = torch.arange(7, 256, 8)  # the last of every 8 rows
    want = torch.zeros(2, 8, 8).index_add_(1, picked // BLOCK, mass[:, picked])
    assert torch.equal(got, want)


def test_coverage_keep_by_hand():
    est = torch.tensor([[[1.0, 0, 0], [0.5, 0.1, 0], [0.2, 0.5, 0.3]]])
    assert coverage_keep(est, 0, 0.5).tolist() == [[[True, False, False], [True, True, False], [False, True, True]]]
    assert coverage_keep(est, 0, 0.9).tolist() == [[[True, False, False], [True, True, False], [True, True, True]]]
    assert coverage_keep(est[:, 1:], 1, 0.8).tolist() == [[[True, True, False], [False, True, True]]]


def test_oracle_with_an_estimate():
    q, k, v = (t[0] for t in synthetic_qkv(256, 4, 2, 64, spec=SyntheticSpec(), seed=2))
    base, _, _ = oracle_attention(q, k, v, BlockOracle(coverage=0.7, block=BLOCK))
    same, _, _ = oracle_attention(q, k, v, BlockOracle(coverage=0.7, block=BLOCK, estimate="antidiag1"))
    assert torch.allclose(base.float(), same.float(), atol=1e-6)
    out, kept, causal = oracle_attention(q, k, v, BlockOracle(coverage=0.7, block=BLOCK, estimate="antidiag8"),
                                         rows_per_step=3 * BLOCK)
    assert 4 * 8 < kept < causal
    assert not torch.isnan(out).any()
    dense = reference.dense_attention(q, k, v).float()
    assert float((out.float() - dense).norm() / dense.norm()) < 0.5


def test_estimate_arguments():
    assert parse("antidiag16", 128) == ("antidiag", 16) and parse("exact", 64) == ("exact", 0)
    for bad in ("antidiag3", "rows0", "rows256", "pooled4", "exact2"):
        with pytest.raises(ValueError, match="expected 'exact', 'rowsS' or 'antidiagS'"):
            parse(bad, 128)
    with pytest.raises(ValueError, match="estimate='antidiag8' with a budget"):
        BlockOracle(budget=__import__("crisp_trt").CrispConfig(), estimate="antidiag8")
