"""The whole-model block oracle (bench.oracle): its attention equals reference.attend on masks built by hand
(top blocks by summed dense mass, the diagonal first), for both budgets; the model sweep is in test_long_context."""
import math

import pytest
import torch

from crisp_trt import CrispConfig, reference
from crisp_trt.bench.oracle import BlockOracle, oracle_attention
from crisp_trt.workloads.synthetic import SyntheticSpec, synthetic_qkv

BLOCK = 64
PLAN = CrispConfig(block_size=BLOCK, dense_below=0, min_budget=64, max_budget=128, coverage=0, spike=0)


def hand_masks(q, k, counts=None, coverage=None):
    """Per head and query block: the diagonal, then key blocks by summed dense mass until `counts` blocks or
    `coverage` of the block's mass."""
    n, heads, d = q.shape
    nb, group = -(-n // BLOCK), heads // k.shape[1]
    masks = torch.zeros(heads, nb, nb, dtype=torch.bool)
    for h in range(heads):
        for qb in range(nb):
            r = torch.arange(qb * BLOCK, min(n, (qb + 1) * BLOCK))  # the last block may be partial
            logits = (q[r, h] @ k[:, h // group].T / math.sqrt(d)).masked_fill(torch.arange(n)[None] > r[:, None],
                                                                                float("-inf"))
            p = torch.nn.functional.pad(torch.softmax(logits, -1), (0, nb * BLOCK - n))
            mass = p.view(len(r), nb, BLOCK).sum((0, 2))
            order = [qb] + [int(i) for i in mass.argsort(descending=True) if int(i) != qb and int(i) <= qb]
            held = 0.0
            for j, kb in enumerate(order):
                if (counts is not None and j >= counts[h, qb]) or (coverage is not None and held >= coverage * len(r)):
                    break
                masks[h, qb, kb] = True
                held += float(mass[kb])
    return masks


@pytest.mark.parametrize("budget", ["coverage", "plan"])
def test_oracle_attention_equals_hand_masks(budget):
    n, heads = 500, 4  # a partial last block
    q, k, v = (t[0] for t in synthetic_qkv(n, heads, 2, 64, spec=SyntheticSpec(), seed=5))
    if budget == "coverage":
        oracle, want = BlockOracle(coverage=0.6, block=BLOCK), hand_masks(q, k, coverage=0.6)
    else:
        counts = reference.plan(q, k, PLAN)[1].sum(-1)
        oracle, want = BlockOracle(budget=PLAN, block=BLOCK), hand_masks(q, k, counts=counts)
        assert int(want.sum()) == int(counts.sum())  # the same number of blocks as the plan
    out, kept, causal = oracle_attention(q, k, v, oracle, rows_per_step=3 * BLOCK)  # steps not dividing n
    expected = reference.attend(q, k, v, want, BLOCK).float()
    assert kept == int(want.sum()) and causal == heads * 8 * 9 // 2
    assert heads * 8 / causal + 0.1 < kept / causal < 0.95  # sparse, and well beyond the diagonal alone
    err = float((out.float() - expected).norm() / expected.norm())
    assert err < 1e-5, err


def test_oracle_full_coverage_is_dense():
    q, k, v = (t[0] for t in synthetic_qkv(256, 4, 2, 64, spec=SyntheticSpec(), seed=1))
    out, kept, causal = oracle_attention(q, k, v, BlockOracle(coverage=1.0, block=BLOCK))
    dense = reference.dense_attention(q, k, v).float()
    assert kept == causal and float((out.float() - dense).norm() / dense.norm()) < 1e-5


def test_block_oracle_arguments():
    with pytest.raises(ValueError, match="exactly one of coverage"):
        BlockOracle()
    with pytest.raises(ValueError, match="coverage=1.5"):
        BlockOracle(coverage=1.5)
    with pytest.raises(ValueError, match="block_size=64, expected block=128"):
        BlockOracle(budget=PLAN)

