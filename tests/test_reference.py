"""Properties of the pure-PyTorch reference pipeline (the oracle)."""
import math

import pytest
import torch

from crisp_trt import CrispConfig
from crisp_trt import reference as R
from crisp_trt.workloads.synthetic import synthetic_qkv

KEEP_ALL = CrispConfig(block_size=64, kappa=0.0, coverage=0.0, dense_below=0, max_budget=1 << 20, min_budget=0)


def _rand(n, heads=4, kv_heads=2, d=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, heads, d, generator=g), torch.randn(n, kv_heads, d, generator=g),
            torch.randn(n, kv_heads, d, generator=g))


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("n", [200, 513])
def test_keep_everything_equals_dense(n):
    q, k, v = _rand(n, seed=n)
    out, route, c_struct, dens = R.crisp_sequence(q, k, v, KEEP_ALL)
    assert _rel(out, R.dense_attention(q, k, v)) < 1e-3
    assert torch.all(dens == 1) and torch.all(route == R.ROUTE_VERTICAL_SLASH)


def test_estimate_is_a_distribution_and_matches_proxy():
    q, k, _ = _rand(300, seed=1)
    est = R.estimate(q, k, KEEP_ALL)
    assert torch.allclose(est.vsum.sum(1), torch.ones(4), atol=1e-5)
    assert torch.allclose(est.ssum.sum(1), torch.ones(4), atol=1e-5)
    p = R.proxy_map(q, k, KEEP_ALL)
    # the diagonal (offset 0) mass is the mean of P[i, r_i]
    rows = p.shape[1]
    diag = torch.stack([p[:, i, 300 - rows + i] for i in range(rows)], 1).mean(1)
    assert torch.allclose(est.smax[:, 0].clamp_min(diag), est.smax[:, 0])


@pytest.mark.parametrize("seed", range(3))
def test_sink_local_diagonal_always_kept_and_cstruct_in_range(seed):
    q, k, v = synthetic_qkv(900, 4, 2, 64, seed=seed)
    cfg = CrispConfig(block_size=64, dense_below=0, kappa=1e6, min_budget=0, tau=0.5)
    sel = R.route(R.estimate(q[0], k[0], cfg), q[0], k[0], cfg)
    assert torch.all((sel.c_struct >= 0) & (sel.c_struct <= 1))
    for route in (R.ROUTE_VERTICAL_SLASH, R.ROUTE_BLOCK_SPARSE):  # every head forced onto each route
        masks = R.select(q[0], k[0], sel, cfg, route=route)
        nb = masks.shape[-1]
        for qb in range(nb):
            assert masks[:, qb, 0].all(), "sink block dropped"
            assert masks[:, qb, max(0, qb - cfg.local_blocks): qb + 1].all(), "local/diagonal dropped"
            assert not masks[:, qb, qb + 1:].any(), "future block selected"


def _planted(n, columns=(1000, 1500, 2100, 2900, 3300, 3700), d=64, seed=0):
    """One head: every query reads a fixed set of planted key columns over near-uniform noise."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n, 1, d, generator=g) * 0.05
    k = torch.randn(n, 1, d, generator=g) * 0.05
    q[:, 0, 0] = 4.0
    k[list(columns), 0, 0] = 4.0 * math.log(n) / 4.0 * 1.6
    return q, k


def _kept_columns(n, budget):
    q, k = _planted(n)
    cfg = CrispConfig(block_size=128, dense_below=0, min_budget=0, max_budget=1 << 20, budget=budget,
                      sink_tokens=0, gamma=0.9, coverage=0.0)  # the floor rule itself: kappa fixed
    sel = R.route(R.estimate(q, k, cfg), q, k, cfg)
    return int(sel.columns[0].sum())


def test_floor_keeps_constant_columns_while_cumulative_grows():
    lengths = [4096, 16384, 65536]
    floor = [_kept_columns(n, "floor") for n in lengths]
    cumulative = [_kept_columns(n, "cumulative") for n in lengths]
    assert max(floor) <= 6 and min(floor) >= 5, floor  # the planted columns' blocks, nothing more
    assert cumulative[-1] > 4 * cumulative[0], cumulative  # grows with n
    assert cumulative[-1] > 10 * floor[-1]


def test_jsd_and_tau_zero_routing():
    q, k, _ = _rand(400, seed=3)
    est = R.estimate(q, k, KEEP_ALL)
    for routing in ("struct", "jsd"):
        cfg = KEEP_ALL.replace(kappa=8.0, tau=0.0, routing=routing)
        assert torch.all(R.route(est, q, k, cfg).route == R.ROUTE_VERTICAL_SLASH)
    sel = R.route(est, q, k, KEEP_ALL.replace(routing="jsd", tau=0.1))
    assert torch.all((sel.jsd >= 0) & (sel.jsd <= 1))


@pytest.mark.parametrize("rows,spike,routing", [(0, 0.0, "struct"), (16, 0.0, "struct"), (16, 0.05, "struct"),
                                                (0, 0.0, "jsd")])
def test_tau_above_one_skips_the_estimate_and_keeps_the_blocks(rows, spike, routing):
    """tau > 1: the full route sends every head block-sparse anyway (C_struct, sqrt(JSD) ≤ 1), so the plan without
    the vertical-slash estimate (block_sparse_heads) attends exactly the same blocks; C_struct reads 0."""
    q, k, _ = (t[0] for t in synthetic_qkv(700, 4, 2, 64, seed=5))
    cfg = CrispConfig(block_size=64, dense_below=0, tau=1.5, rows=rows, spike=spike, budget="cumulative", gamma=0.9,
                      routing=routing)
    assert not cfg.estimated and cfg.replace(tau=1.0).estimated
    full = R.route(R.estimate(q, k, cfg), q, k, cfg)
    assert torch.all(full.route == R.ROUTE_BLOCK_SPARSE) and bool((full.c_struct > 0).all())
    sel, masks = R.plan(q, k, cfg)
    assert torch.all(sel.route == R.ROUTE_BLOCK_SPARSE) and torch.all(sel.c_struct == 0)
    assert torch.equal(masks, R.select(q, k, full, cfg))


def test_dense_below_routes_dense():
    q, k, v = _rand(100)
    out, route, _, dens = R.crisp_sequence(q, k, v, CrispConfig(dense_below=1024))
    assert torch.all(route == R.ROUTE_DENSE) and torch.all(dens == 1)
    assert _rel(out, R.dense_attention(q, k, v)) < 1e-6


def test_coverage_halves_kappa_until_cstruct_reaches_it():
    """coverage: a head takes the first kappa of the ladder (kappa, kappa/2, ...) whose C_struct reaches
    coverage, else the last; a head that reaches it is then trimmed by mass (a subset, still ≥ coverage),
    one that never does keeps the last kappa's selection whole; coverage = 0 is the fixed-kappa rule
    with no trim. Lower kappa only adds blocks. The route is decided before the trim."""
    q, k, _ = synthetic_qkv(1500, 6, 2, 64, seed=5)
    q, k = q[0], k[0]
    base = CrispConfig(block_size=64, dense_below=0, min_budget=0, kappa=16.0)
    est = R.estimate(q, k, base)
    fixed = {kappa: R.route(est, q, k, base.replace(kappa=kappa, coverage=0.0)) for kappa in base.kappas()}
    trimmed = 0
    for cov in (0.0, 0.9, 1.0):
        sel = R.route(est, q, k, base.replace(coverage=cov))
        for h in range(q.shape[1]):
            ladder = base.replace(coverage=cov).kappas()
            first = next((kp for kp in ladder if fixed[kp].c_struct[h] >= cov), ladder[-1])
            want = fixed[first]
            assert int(sel.route[h]) == int(torch.where(want.c_struct[h] >= base.tau, 1, 2))
            if cov == 0 or want.c_struct[h] < cov:
                assert torch.equal(sel.columns[h], want.columns[h])
                assert torch.equal(sel.distances[h], want.distances[h])
                assert float(sel.c_struct[h]) == float(want.c_struct[h])
            else:
                assert torch.all(want.columns[h] | ~sel.columns[h]) and torch.all(want.distances[h] | ~sel.distances[h])
                assert float(sel.c_struct[h]) == float(want.c_struct[h])  # the ladder's, which routed
                covered = _covered(est, sel, h)
                assert cov <= covered <= float(want.c_struct[h]) + 1e-6
                trimmed += int(want.columns[h].sum() + want.distances[h].sum() - sel.columns[h].sum()
                               - sel.distances[h].sum())
    assert trimmed > 0, "the trim never dropped a block"
    lo, hi = fixed[16.0], fixed[2.0]
    assert torch.all(hi.columns | ~lo.columns) and torch.all(hi.distances | ~lo.distances)
    assert torch.all(hi.c_struct >= lo.c_struct)
    assert any(fixed[16.0].c_struct[h] < 0.9 for h in range(q.shape[1])), "the ladder is never exercised"


def _covered(est, sel, h):
    """The mass the (trimmed) selection of head h covers on the last query block's key blocks."""
    nb = est.vsum.shape[1]
    union = R.vertical_slash_union(sel.columns[h], sel.distances[h], nb - 1)
    return float(est.vsum[h][union].sum().clamp(0, 1))


@pytest.mark.parametrize("tau", [0.7, 0.9])
def test_route_is_vertical_slash_iff_reported_cstruct_reaches_tau_when_coverage_below_tau(tau):
    """With coverage < tau the trim can leave a vertical-slash head covering less than tau; the reported
    C_struct is the ladder's (the value that routed it), so route == VS iff C_struct >= tau still holds."""
    q, k, _ = synthetic_qkv(1500, 6, 2, 64, seed=5)
    q, k = q[0], k[0]
    cfg = CrispConfig(block_size=64, dense_below=0, min_budget=0, kappa=2.0, coverage=0.5, tau=tau)
    est = R.estimate(q, k, cfg)
    sel = R.route(est, q, k, cfg)
    want = torch.where(sel.c_struct >= tau, R.ROUTE_VERTICAL_SLASH, R.ROUTE_BLOCK_SPARSE)
    assert torch.equal(sel.route, want)
    below = [h for h in range(q.shape[1]) if sel.route[h] == R.ROUTE_VERTICAL_SLASH and _covered(est, sel, h) < tau]
    assert below, "no vertical-slash head was trimmed below tau: the case is not exercised"


def test_trim_drops_the_lightest_blocks_while_coverage_holds():
    """trim_to_coverage keeps the heaviest kept columns and offsets (one mass threshold for both) that still
    cover `coverage` of the last query block's window mass; the sink column and local offset stay; each of
    the two keeps min(min_blocks, kept) candidates. A light block kept by the floor rule goes."""
    vs = torch.tensor([0.30, 0.25, 0.02, 0.20, 0.01, 0.10, 0.05, 0.07])  # key blocks 0..7, the last is 7
    ss = torch.tensor([0.50, 0.00, 0.00, 0.04, 0.00, 0.00, 0.00, 0.00])
    columns = torch.tensor([True, True, True, True, True, False, False, False])  # sink 0, candidates 1-4 kept
    offsets = torch.tensor([True, False, False, True, False, False, False, False])  # local 0 → blocks 7, 6
    cfg = CrispConfig(block_size=64, coverage=0.85, min_budget=0)
    assert float(R.covered_mass(vs, columns, offsets)) == pytest.approx(0.90)
    cols, offs = R.trim_to_coverage(vs, ss, columns, offsets, 1, 1, cfg)
    # by mass: column 1 (0.25) → 0.67, column 3 (0.20) → 0.87 ≥ 0.85: stop; columns 2, 4 and offset 3 go
    assert cols.tolist() == [True, True, False, True, False, False, False, False]
    assert offs.tolist() == [True] + [False] * 7
    assert float(R.covered_mass(vs, cols, offs)) == pytest.approx(0.87)
    # min budget of two blocks: the one kept offset (0.04) stays, so t = 0.04 and columns 2, 4 still go
    cols, offs = R.trim_to_coverage(vs, ss, columns, offsets, 1, 1, cfg.replace(min_budget=128))
    assert cols.tolist() == [True, True, False, True, False, False, False, False]
    assert offs.tolist() == [True, False, False, True, False, False, False, False]
    # at the selection's own C_struct only column 4 goes: offset 3's diagonal covers its key block too
    full = float(R.covered_mass(vs, columns, offsets))
    cols, offs = R.trim_to_coverage(vs, ss, columns, offsets, 1, 1, cfg.replace(coverage=full))
    assert cols.tolist() == [True, True, True, True, False, False, False, False] and torch.equal(offs, offsets)


def test_cap_ranks_by_mass():
    """The floor rule and the min budget read each block's max, but the cap ranks by mass: when more than
    max_blocks are kept, the heaviest of those stay (a sharp block loses to a heavier one); the cumulative
    rule ranks by mass throughout."""
    mass = torch.tensor([0.30, 0.02, 0.20, 0.25, 0.05, 0.18])
    score = torch.tensor([0.01, 0.50, 0.04, 0.02, 0.00, 0.03])  # block 1: one sharp entry, little mass
    width, always = torch.ones(6), torch.tensor(0.0)
    floor = CrispConfig(block_size=64, kappa=1.0, floor_quantile=0.0, min_budget=0, max_budget=6 * 64)
    # floor = min(mass) = 0.02, so every score above 0.02 passes: blocks 1, 2, 5 (and not 3: 0.02 is not > 0.02)
    assert R._keep(score, mass, width, always, floor).tolist() == [False, True, True, False, False, True]
    assert R._keep(score, mass, width, always, floor.replace(max_budget=2 * 64)).tolist() == \
        [False, False, True, False, False, True]  # the cap keeps the heaviest two of the three that passed
    assert R._keep(score, mass, width, always, floor.replace(min_budget=4 * 64)).tolist() == \
        [False, True, True, True, False, True]  # at least the four sharpest
    gamma = floor.replace(budget="cumulative", gamma=0.5)
    assert R._keep(score, mass, width, always, gamma).tolist() == [True, False, False, True, False, False]
    assert R._keep(score, mass, width, always, gamma.replace(max_budget=64)).tolist() == \
        [True, False, False, False, False, False]


# --- chunked prefill and LSE ----------------------------------------------------------------------------------

CHUNK_BASE = CrispConfig(block_size=64, dense_below=0, min_budget=128, max_budget=512)
CHUNK_CONFIGS = {
    "crisp": CHUNK_BASE,
    "block_sparse": CHUNK_BASE.replace(tau=1.5),
    "cumulative": CHUNK_BASE.replace(budget="cumulative"),
    "jsd": CHUNK_BASE.replace(routing="jsd", tau=0.1),
    "window32": CHUNK_BASE.replace(last_q=32, tau=0.97),
    "rows": CHUNK_BASE.replace(tau=1.5, rows=16, budget="cumulative", gamma=0.95, min_budget=0),
}


@pytest.mark.parametrize("name", sorted(CHUNK_CONFIGS))
@pytest.mark.parametrize("offset", [256, 512])
def test_chunk_equals_the_one_call_rows(name, offset):
    """q_len ≥ window and offset % B == 0: the chunk's plan is the prefix's, so its rows, routes, C_struct and
    the masks of the query blocks it touches are the one call's."""
    cfg = CHUNK_CONFIGS[name]
    q, k, v = (t[0] for t in synthetic_qkv(600, 4, 2, 64, seed=11))
    sel, whole = R.plan(q, k, cfg)
    c_sel, part = R.plan(q[offset:], k, cfg)
    assert torch.equal(c_sel.route, sel.route) and torch.equal(c_sel.c_struct, sel.c_struct)
    qb0 = offset // cfg.block_size
    assert torch.equal(part[:, qb0:], whole[:, qb0:]) and not part[:, :qb0].any()
    chunk = R.attend(q[offset:], k, v, part, cfg.block_size)
    assert torch.isfinite(chunk).all() and _rel(chunk, R.attend(q, k, v, whole, cfg.block_size, offset)) < 1e-5


@pytest.mark.parametrize("offset", [0, 100, 333, 599])
def test_chunk_at_kappa_zero_is_dense(offset):
    """A keep-everything config attends every causal block, so any chunk (offset not a multiple of B, q_len
    below the window, a single row) is dense attention of its rows, LSE included."""
    q, k, v = _rand(600, seed=offset)
    out, route, _, dens, lse = R.crisp_sequence(q[offset:], k, v, KEEP_ALL, return_lse=True)
    want, want_lse = R.dense_attention(q, k, v, return_lse=True)
    assert out.shape == (600 - offset, 4, 32) and lse.shape == (600 - offset, 4) and lse.dtype == torch.float32
    assert torch.isfinite(out).all() and _rel(out, want[offset:]) < 1e-5
    assert _rel(lse, want_lse[offset:]) < 1e-6 and torch.all(dens == 1)


@pytest.mark.parametrize("offset", [0, 170])
def test_lse_is_the_masked_logsumexp(offset):
    """attend's LSE is torch.logsumexp of the scaled logits over the planned blocks (and causal), per row/head."""
    cfg = CHUNK_BASE.replace(tau=1.5, min_budget=0, spike=0.0)  # block-sparse heads: a sparse plan at 500 tokens
    q, k, v = (t[0] for t in synthetic_qkv(500, 4, 2, 64, seed=12))
    chunk = q[offset:]
    _, route, _, _, lse = R.crisp_sequence(chunk, k, v, cfg, return_lse=True)
    masks = R.plan(chunk, k, cfg)[1]
    pos = torch.arange(500)
    for h in range(4):
        logits = chunk[:, h] @ k[:, h // 2].T / 8.0
        allowed = masks[h][pos[offset:] // 64][:, pos // 64] & (pos[offset:, None] >= pos[None, :])
        want = torch.logsumexp(logits.masked_fill(~allowed, float("-inf")), -1)
        assert torch.isfinite(lse[:, h]).all() and _rel(lse[:, h], want) < 1e-6
    assert bool((masks[:, 2:].sum() < R.causal_block_mask(500, 4, 64)[:, 2:].sum()))  # sparse: not dense's LSE


def test_merge_partials_equals_the_union():
    """Two disjoint key sets (the cached prefix's blocks and the chunk's own, as a chunked prefill splits them,
    and a random split of the sparse plan): outputs merged by their LSEs equal attention over the union."""
    q, k, v = _rand(700, seed=13)
    offset, block = 320, 64
    chunk = q[offset:]
    masks = R.plan(chunk, k, CHUNK_BASE)[1]
    qb = torch.arange(masks.shape[-1])
    before = qb[None, :] < offset // block  # key blocks of the prefix: wholly before every chunk row
    g = torch.Generator().manual_seed(3)
    coin = torch.rand(masks.shape, generator=g) < 0.5
    for part_a in (masks & before, masks & (coin | (qb[:, None] == qb[None, :]))):  # each row keeps a key in b
        part_b = masks & ~part_a
        out_a, lse_a = R.attend(chunk, k, v, part_a, block, return_lse=True)
        out_b, lse_b = R.attend(chunk, k, v, part_b, block, return_lse=True)
        whole, lse = R.attend(chunk, k, v, masks, block, return_lse=True)
        out, merged = R.merge_partials(out_a, lse_a, out_b, lse_b)
        assert torch.isfinite(out).all() and _rel(out, whole) < 1e-5 and _rel(merged, lse) < 1e-6


def test_pool_blocks_of_a_chunk():
    """A chunk's pooled q: its rows in each absolute block, the partial first block divided by its own rows."""
    q, _, _ = _rand(300, seed=14)
    got = R.pool_blocks(q[100:], 64, first=100)  # blocks 1..4: rows 100-127, 128-191, 192-255, 256-299
    assert got.shape == (4, 4, 32)
    for i, (a, b) in enumerate([(100, 128), (128, 192), (192, 256), (256, 300)]):
        assert torch.allclose(got[i], q[a:b].mean(0), atol=1e-6)
    assert torch.equal(R.pool_blocks(q, 64, first=0), R.pool_blocks(q, 64))


# --- spikes: select's per-row far-block detector (CrispConfig.spike) ---------------------------------------------

def test_spike_mass_is_each_rows_largest_share():
    """spike_mass[h, qb, kb] = max over the rows i of block qb of softmax_j≤qb(q_i · k̄_j / sqrt(d))[kb], kb < qb."""
    q, k, _ = _rand(300, seed=5)
    block = 64
    got = R.spike_mass(q, k, block, rows_per_step=70)  # steps that cut across blocks
    pk = R._expand_kv(R.pool_blocks(k, block), 4)
    for h, qb in ((0, 4), (3, 2), (1, 0)):
        rows = q[qb * block: (qb + 1) * block, h]
        share = torch.softmax(rows @ pk[: qb + 1, h].T / math.sqrt(32), -1).amax(0)
        assert torch.allclose(got[h, qb, :qb], share[:qb], atol=1e-6)
        assert not got[h, qb, qb:].any()


def test_spike_finds_a_far_block_the_last_window_misses():
    """One row putting most of its attention on a far block: the last-window plan misses the block, spike adds
    it (and only adds), and that row's error falls."""
    q, k, v = (t[0] for t in synthetic_qkv(1024, 2, 1, 64, seed=3))
    row, far, block = 700, 2, 64
    q[row, 0] = 6 * k[far * block:(far + 1) * block, 0].mean(0) / k[far * block:(far + 1) * block, 0].mean(0).norm()
    cfg = CrispConfig(block_size=block, dense_below=0, kappa=1e6, coverage=0.0, min_budget=0, tau=0.0, spike=0.0)
    _, plain = R.plan(q, k, cfg)
    _, spiked = R.plan(q, k, cfg.replace(spike=0.05))
    assert not plain[0, row // block, far] and spiked[0, row // block, far]
    assert bool((spiked | ~plain).all()), "spike only adds blocks"
    dense = R.dense_attention(q, k, v)[row]
    err = [_rel(R.attend(q, k, v, m, block, row)[0], dense) for m in (plain, spiked)]
    assert err[1] < 0.5 * err[0]


def test_add_spikes_keeps_the_lowest_new_blocks_up_to_max_blocks():
    masks = torch.zeros(1, 1, 8, dtype=torch.bool)
    masks[0, 0, 1] = True
    extra = torch.ones(1, 1, 8, dtype=torch.bool)
    out = R.add_spikes(masks, extra, 3)
    assert out[0, 0].tolist() == [True, True, True, True, False, False, False, False]


def test_spike_off_is_the_plain_plan_and_bad_values_are_rejected():
    q, k, _ = _rand(400, seed=6)
    cfg = CrispConfig(block_size=64, dense_below=0, spike=0.0)
    assert not R.spikes(q, k, cfg).any()  # off: no extra block anywhere
    plain, spiked = R.plan(q, k, cfg)[1], R.plan(q, k, cfg.replace(spike=CrispConfig().spike))[1]
    assert bool((spiked | ~plain).all())  # the default's spike only adds to the plain plan
    for bad in (-0.1, 1.0, float("nan")):
        with pytest.raises((ValueError, TypeError), match="spike"):
            CrispConfig(spike=bad)


# --- sampled rows (CrispConfig.rows) --------------------------------------------------------------------------

@pytest.mark.parametrize("first", [0, 100])
def test_rows_mass_is_the_sampled_rows_mean_attention(first):
    """rows_mass[h, qb] = mean over the block's sampled rows (the last of every B / rows, clamped to the chunk) of
    their causal softmax summed per key block: checked row by row against a direct softmax."""
    q, k, _ = _rand(300, seed=8)
    cfg = CrispConfig(block_size=64, rows=16)
    got = R.rows_mass(q[first:], k, cfg)
    assert got.shape == (4, 5, 5) and not got[:, : first // 64].any()
    for h, qb in ((0, 4), (3, 2), (1, first // 64)):
        pos = [min(max(qb * 64 + 4 * t + 3, first), 299) for t in range(16)]
        want = torch.zeros(5)
        for r in pos:
            p = torch.softmax(q[r, h] @ k[: r + 1, h // 2].T / math.sqrt(32), -1)
            want += torch.nn.functional.pad(p, (0, 320 - r - 1)).view(5, 64).sum(-1) / 16
        assert torch.allclose(got[h, qb], want, atol=1e-6)
        assert torch.allclose(got[h, qb].sum(), torch.tensor(1.0), atol=1e-5) and not got[h, qb, qb + 1:].any()


def test_rows_select_block_sparse_rows_by_the_sampled_rows():
    """With rows > 0 a block-sparse row keeps what block_sparse_row keeps on rows_mass's row; vertical-slash heads
    are unchanged; with every row sampled and gamma 1 the row holds every block with mass."""
    q, k, _ = (t[0] for t in synthetic_qkv(640, 4, 2, 64, seed=12))
    cfg = CrispConfig(block_size=64, dense_below=0, min_budget=0, budget="cumulative", gamma=0.9, rows=16, spike=0.0)
    sel, masks = R.plan(q, k, cfg.replace(tau=1.5))  # every head block-sparse
    mass = R.rows_mass(q, k, cfg)
    for h, qb in ((0, 9), (2, 5), (3, 7)):
        assert torch.equal(masks[h, qb], R.block_sparse_row(mass[h, qb], qb, cfg))
    pooled = R.plan(q, k, cfg.replace(tau=1.5, rows=0))[1]
    assert not torch.equal(masks, pooled)  # another estimate, another selection
    vs = R.plan(q, k, cfg.replace(tau=0.0))[1]
    assert torch.equal(vs, R.plan(q, k, cfg.replace(tau=0.0, rows=0))[1])  # vertical-slash heads ignore rows
    full = R.plan(q, k, cfg.replace(tau=1.5, rows=64, gamma=1.0))[1]
    assert torch.equal(full, R.causal_block_mask(640, 4, 64))


def test_rows_values_are_checked():
    for bad in (8, 48, 128):
        with pytest.raises(ValueError, match="CrispConfig.rows"):
            CrispConfig(rows=bad)
