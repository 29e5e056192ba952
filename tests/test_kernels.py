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


@pytest.mark.parametrize("lens,window,block", [([330], 64, 64), ([150, 40, 260], 32, 64), ([420, 100], 128, 128),
                                               ([300], 32, 128)])
def test_estimate_matches_reference(device, lens, window, block):
    """Block 128 runs two [L, 64] sub-tiles per key block, with up to three diagonal wraps each."""
    from crisp_trt.kernels.pipeline import Stages

    cfg = CrispConfig(block_size=block, last_q=window, dense_below=0)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    q, k, _ = (t[0].half() for t in synthetic_qkv(int(cu[-1]), 4, 2, 64, seed=2))
    st = Stages(q.to(device), k.to(device), cu.to(device), max(lens), cfg)
    st.estimate()
    for s, n in enumerate(lens):
        a, b = int(cu[s]), int(cu[s + 1])
        want = reference.estimate(q[a:b].float(), k[a:b].float(), cfg)
        m = reference.num_blocks(n, block)
        for g, w in zip((st.vsum, st.vmax, st.ssum, st.smax), (want.vsum, want.vmax, want.ssum, want.smax)):
            assert torch.allclose(g[s, :, :m].cpu(), w, atol=2e-3, rtol=2e-2)
        pooled = reference.pool_blocks(q[a:b], block)
        assert torch.allclose(st.pooled_q[s, :m].cpu(), pooled, atol=1e-4)
        pooled_k = reference.pool_blocks(k[a:b], block)
        assert torch.allclose(st.pooled_k[s, :m].cpu(), pooled_k, atol=1e-4)
        assert st.pooled_k_in.dtype == q.dtype  # spike's operands: pooled_k rounded to q's dtype
        assert torch.equal(st.pooled_k_in[s, :m].cpu(), st.pooled_k[s, :m].cpu().to(q.dtype))


BASE = CrispConfig(block_size=64, dense_below=0, min_budget=128, max_budget=512, spike=0.0)  # spike: its own cases
PIPELINE_CONFIGS = {
    "crisp": BASE,
    "crisp_fixed_kappa": BASE.replace(coverage=0.0),  # no kappa ladder
    "crisp_full_ladder": BASE.replace(coverage=1.0),  # every head down to kappa / 8
    "crisp_trim": BASE.replace(coverage=0.9, kappa=2.0),  # the trim drops columns and offsets in every head
    "crisp_trim_min_binds": BASE.replace(coverage=0.9, kappa=2.0, min_budget=384),  # ... fewer: 6-block minimum
    "crisp_trim_below_tau": BASE.replace(coverage=0.5, kappa=2.0, tau=0.9),  # trimmed VS heads cover < tau
    "block_sparse": BASE.replace(tau=1.5),  # every head block-sparse: the sampled noise floor per row
    "block_sparse_capped": BASE.replace(tau=1.5, kappa=1.5, max_budget=128),  # max budget binds
    "crisp_gamma": BASE.replace(budget="cumulative"),
    "gamma_block_sparse": BASE.replace(budget="cumulative", tau=1.5),
    "crisp_jsd": BASE.replace(routing="jsd", tau=0.1),
    "jsd_block_sparse": BASE.replace(routing="jsd", tau=1.5),  # tau > 1: no estimate, no JSD, every head pooled
    "spike_vertical_slash": BASE.replace(tau=0.0, kappa=64.0, spike=0.1),  # spikes beside columns and diagonals
    "spike_block_sparse": BASE.replace(tau=1.5, kappa=64.0, spike=0.1),  # ... beside a block-sparse row's picks
    "spike_capped": BASE.replace(tau=0.0, kappa=64.0, spike=0.01, max_budget=128),  # more spikes than max_blocks
    "rows_cumulative": BASE.replace(tau=1.5, rows=16, budget="cumulative", gamma=0.95, min_budget=0),  # sampled rows
    "rows_floor_mixed": BASE.replace(tau=0.985, kappa=1.5, rows=32, spike=0.1),  # floor budget, 2 of 4 heads, spikes
}


def _plan_vs_reference(device, cfg, lens, heads, kv_heads, d, dtype, seed=4):
    """Run the CUDA pipeline (kernels) and the reference on each sequence; compare decisions and output."""
    from crisp_trt.kernels.pipeline import crisp_cuda, masks_from_plan, plan

    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    q, k, v = (t[0].to(dtype) for t in synthetic_qkv(int(cu[-1]), heads, kv_heads, d, seed=seed))
    args = [t.to(device) for t in (q, k, cu)]
    p = plan(*args, max(lens), cfg)
    out = crisp_cuda(args[0], args[1], v.to(device), args[2], max(lens), cfg)[0].cpu()
    for s, n in enumerate(lens):
        a, b = int(cu[s]), int(cu[s + 1])
        if n == 0:
            continue
        qs, ks, vs = q[a:b].float(), k[a:b].float(), v[a:b].float()
        want, route, c_struct, dens = reference.crisp_sequence(qs, ks, vs, cfg)
        nb = reference.num_blocks(n, cfg.block_size)
        got = masks_from_plan(p, s, nb).cpu()
        if n >= max(cfg.dense_below, 1):
            want_masks = reference.select(qs, ks, reference.route(
                reference.estimate(qs, ks, cfg), qs, ks, cfg), cfg)
            assert (got != want_masks).float().mean() <= 0.005, "selected blocks differ from the reference"
            counts = p.counts[s, :, :nb].cpu()
            for h in range(heads):  # lists: strictly below the diagonal, never a block twice
                for qb in range(0, nb, max(1, nb // 7)):
                    row = p.idx[s, h, qb, : int(counts[h, qb])].cpu()
                    assert bool((row < qb).all()) and row.unique().numel() == row.numel()
        assert torch.equal(p.route[s].cpu().long(), route.long())
        assert torch.allclose(p.c_struct[s].cpu(), c_struct.float(), atol=1e-3)
        if cfg.routing == "struct" and n >= max(cfg.dense_below, 1):  # C_struct is the value that routed
            assert torch.equal(p.route[s].cpu().long(), torch.where(p.c_struct[s].cpu() >= cfg.tau, 1, 2))
        assert torch.allclose(p.density[s].cpu(), dens.float(), atol=0.01)
        assert torch.isfinite(out[a:b]).all()
        assert _rel(out[a:b], want) < 1e-2


@pytest.mark.parametrize("lens_q,lens_k,rows,block,heads,programs", [
    ([900], [900], 16, 64, 4, None), ([900], [900], 16, 64, 4, 1),
    ([400, 37, 0, 50], [900, 300, 100, 50], 32, 64, 4, None), ([400, 37, 0, 50], [900, 300, 100, 50], 32, 64, 4, 3),
    ([129, 700], [1000, 700], 64, 128, 6, None)])
def test_rows_kernel_writes_rows_mass(device, lens_q, lens_k, rows, block, heads, programs):
    """rows_kernel's scratch rows equal reference.rows_mass on every block-sparse head and query block a chunk
    touches (chunks off block boundaries, an empty and a dense sequence, R 16 / 32 / 64, B 64 / 128); with
    `programs`, that few persistent programs, so each walks several tiles through its one slot."""
    from crisp_trt.kernels.pipeline import Stages

    cfg = CrispConfig(block_size=block, dense_below=60, tau=1.5, rows=rows, spike=0.0, min_budget=0,
                      budget="cumulative")
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    whole, k, _ = (t[0].half() for t in synthetic_qkv(int(cu_k[-1]), heads, 2, 64, seed=3))  # f32 dots: TF32
    q = torch.cat([whole[int(end) - n: int(end)] for n, end in zip(lens_q, cu_k[1:])])
    st = Stages(*(t.to(device) for t in (q, k, cu_q)), max(lens_k), cfg, cu_seqlens_k=cu_k.to(device))
    if programs:
        assert st.grids["rows"][0] > programs
        st.grids = {**st.grids, "rows": (programs, 1, 1)}
    st.estimate()
    st.route()
    st.select()
    scratch, checked = st._buffer("scratch").cpu(), 0
    for s, (ql, kl) in enumerate(zip(lens_q, lens_k)):
        if ql == 0 or kl < cfg.dense_below:
            continue
        qa, ka = int(cu_q[s]), int(cu_k[s])
        want = reference.rows_mass(q[qa:qa + ql], k[ka:ka + kl], cfg)
        for h in range(heads):
            assert int(st.route_[s, h]) == 2
            for qb in range((kl - ql) // block, reference.num_blocks(kl, block)):
                got = scratch[s, h, qb, :qb + 1]
                assert torch.isfinite(got).all() and torch.allclose(got, want[h, qb, :qb + 1], atol=1e-5)
                checked += 1
    assert checked > 0


@pytest.mark.parametrize("name", sorted(PIPELINE_CONFIGS))
def test_pipeline_matches_reference(device, name):
    _plan_vs_reference(device, PIPELINE_CONFIGS[name], [900], 4, 2, 64, torch.float16)


@pytest.mark.parametrize("heads,kv_heads,d,dtype", [(4, 1, 128, torch.float16), (2, 2, 256, torch.bfloat16),
                                                    (6, 2, 64, torch.bfloat16)])
def test_pipeline_shapes_and_dtypes(device, heads, kv_heads, d, dtype):
    if device == "cpu" and dtype == torch.bfloat16:
        pytest.skip("bf16 gives garbage in the Triton 3.6 interpreter (numpy has no bf16); checked on GPU")
    _plan_vs_reference(device, BASE.replace(tau=0.97), [700], heads, kv_heads, d, dtype)


def test_pipeline_varlen(device):
    """Sparse, empty, short (dense_below) and block-sparse-routed sequences in one packed batch."""
    cfg = BASE.replace(dense_below=256, tau=0.97)
    _plan_vs_reference(device, cfg, [640, 0, 200, 1000, 64], 4, 2, 64, torch.float16)


def test_crisp_cuda_dense_and_poison(device):
    from crisp_trt.kernels.pipeline import crisp_cuda

    q, k, v = (t[0].half().to(device) for t in synthetic_qkv(300, 4, 2, 64, seed=3))
    cu = torch.tensor([0, 120, 300], dtype=torch.int32, device=device)
    cfg = CrispConfig(block_size=64)
    out, _, route, c_struct, dens = crisp_cuda(q, k, v, cu, 180, cfg)  # both below dense_below: dense
    for a, b in ((0, 120), (120, 300)):
        want = reference.dense_attention(q[a:b].cpu(), k[a:b].cpu(), v[a:b].cpu())
        assert _rel(out[a:b].cpu(), want) < 1e-2
    assert route.shape == (2, 4) and bool((route == 0).all()) and bool((dens == 1).all())
    k[7, 1, 3] = float("nan")
    assert torch.isnan(crisp_cuda(q, k, v, cu, 180, cfg)[0]).all()
    k[7, 1, 3] = 0.0
    bad = torch.tensor([0, 200, 120], dtype=torch.int32, device=device)
    assert torch.isnan(crisp_cuda(q, k, v, bad, 200, cfg)[0]).all()


@pytest.mark.parametrize("where", ["q", "k", "v"])
def test_poison_scans_every_element_of_each_input(device, where):
    """The scan's one-dimensional grid covers q, then k, then v to their last element (keys longer than queries, as
    a chunk has, and sizes that are not a multiple of a program's elements): a NaN or inf at the first or last
    element of any one of them poisons the output and the LSE, and finite inputs leave both as they were."""
    from crisp_trt.kernels.poison import poison

    q, k, v = (torch.randn(n, h, 64, device=device) for n, h in ((45, 4), (133, 2), (133, 2)))
    cu, cu_k = (torch.tensor([0, n], dtype=torch.int32, device=device) for n in (45, 133))
    flag = torch.zeros(1, dtype=torch.int32, device=device)
    out, lse = torch.zeros_like(q), torch.zeros(45, 4, device=device)
    poison(q, k, v, cu, cu_k, out, lse, flag)
    assert int(flag) == 0 and not out.isnan().any() and not lse.isnan().any()
    x = {"q": q, "k": k, "v": v}[where]
    for i, bad in ((0, float("nan")), (x.numel() - 1, float("inf")), (x.numel() - 1, float("-inf"))):
        flag.zero_()
        out.zero_()
        lse.zero_()
        x.view(-1)[i] = bad
        poison(q, k, v, cu, cu_k, out, lse, flag)
        x.view(-1)[i] = 0.0
        assert int(flag) == 1 and out.isnan().all() and lse.isnan().all(), (where, i, bad)


@pytest.mark.parametrize("tau,route,chunked", [(0.97, 1, False), (1.5, 2, False), (1.5, 2, True)])
def test_pipeline_reads_only_what_it_wrote(device, tau, route, chunked):
    """The workspace comes from torch.empty: a plan must not depend on what a previous user left there. The
    same packed batch (varlen, partial last blocks; vertical-slash heads, then block-sparse ones)
    planned and attended over a zeroed, an all-0xFF (NaN floats, -1 ints) and a random-byte workspace gives
    bitwise-equal plans and outputs. On the GPU a second zeroed run first checks that the plan is deterministic
    at all (estimate's relaxed atomics could reorder a float sum), so a failure after it is a stale read. Chunked:
    the same keys with the last 170 / 300 queries (query blocks before a chunk are neither pooled nor listed)."""
    from crisp_trt.kernels.pipeline import Stages

    cfg = BASE.replace(dense_below=0, tau=tau)
    lens = [450, 700]
    cu_k = torch.tensor([0, 450, 1150], dtype=torch.int32, device=device)
    q, k, v = (t[0].half().to(device) for t in synthetic_qkv(1150, 4, 2, 64, seed=6))
    cu = cu_k
    if chunked:
        q, cu = torch.cat([q[280:450], q[850:]]), torch.tensor([0, 170, 470], dtype=torch.int32, device=device)
    fills = {"zeroed": lambda m: m.zero_(), "0xFF": lambda m: m.fill_(255), "random bytes": lambda m: m.random_(0, 256)}
    if device == "cuda":  # the interpreter is sequential; on the GPU the order of atomic adds could vary
        fills = {"zeroed": fills["zeroed"], "zeroed again (determinism)": fills["zeroed"], **fills}
    runs = []
    for fill in fills.values():
        st = Stages(q, k, cu, max(lens), cfg, cu_k)
        fill(st.memory)
        p = st.plan()
        runs.append((st.attend(v), p))
    (out0, p0), rest = runs[0], runs[1:]
    assert torch.isfinite(out0).all() and bool((p0.route == route).any())
    for what, (out, p) in zip(list(fills)[1:], rest):
        assert torch.equal(out, out0), what
        for name in ("counts", "dense", "route", "c_struct", "density"):
            assert torch.equal(getattr(p, name), getattr(p0, name)), (what, name)
        valid = torch.arange(p.idx.shape[-1], device=device) < p.counts[..., None]
        assert torch.equal(torch.where(valid, p.idx, -1), torch.where(valid, p0.idx, -1)), what


# --- chunked prefill and LSE (queries: the last q_len of each sequence's kv_len positions) -------------------

def _chunks_vs_reference(device, cfg, lens_q, lens_k, heads, kv_heads, d, dtype=torch.float16, seed=8):
    """Packed chunks through the kernels (plan and crisp_cuda with cu_seqlens_k and the LSE) against
    reference.crisp_sequence of each chunk: masks of the touched query blocks, route, C_struct, density, rows, LSE."""
    from crisp_trt.kernels.pipeline import crisp_cuda, masks_from_plan, plan

    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    qs, k, v = (t[0].to(dtype) for t in synthetic_qkv(int(cu_k[-1]), heads, kv_heads, d, seed=seed))
    q = torch.cat([qs[int(b) - n: int(b)] for n, b in zip(lens_q, cu_k[1:])])  # each sequence's last rows
    dev = [t.to(device) for t in (q, k, v, cu_q, cu_k)]
    p = plan(dev[0], dev[1], dev[3], max(lens_k), cfg, cu_seqlens_k=dev[4])
    out, lse, route, c_struct, dens = (t.cpu() for t in crisp_cuda(*dev[:4], max(lens_k), cfg, cu_seqlens_k=dev[4],
                                                                    return_lse=True))
    assert lse.shape == (q.shape[0], heads) and lse.dtype == torch.float32
    for s, (q_len, kv_len) in enumerate(zip(lens_q, lens_k)):
        qa, qb, ka, kb = int(cu_q[s]), int(cu_q[s + 1]), int(cu_k[s]), int(cu_k[s + 1])
        if q_len == 0:
            assert float(dens[s].abs().sum()) == 0 and bool((route[s] == 0).all())
            continue
        qf, kf, vf = q[qa:qb].float(), k[ka:kb].float(), v[ka:kb].float()
        want, w_route, w_c_struct, w_dens, w_lse = reference.crisp_sequence(qf, kf, vf, cfg, return_lse=True)
        nb, qb0 = reference.num_blocks(kv_len, cfg.block_size), reference.first_block(qf, kf, cfg.block_size)
        if kv_len >= max(cfg.dense_below, 1):
            got = masks_from_plan(p, s, nb, torch.arange(qb0, nb)).cpu()
            want_masks = reference.plan(qf, kf, cfg)[1][:, qb0:]
            assert (got != want_masks).float().mean() <= 0.005, "selected blocks differ from the reference"
            assert int(p.counts[s, :, :qb0].abs().sum()) == 0, "a query block before the chunk was listed"
        assert torch.equal(route[s].long(), w_route.long())
        assert torch.allclose(c_struct[s], w_c_struct.float(), atol=1e-3)
        assert torch.allclose(dens[s], w_dens.float(), atol=0.01)
        assert torch.isfinite(out[qa:qb]).all() and _rel(out[qa:qb], want) < 1e-2
        assert torch.isfinite(lse[qa:qb]).all() and float((lse[qa:qb] - w_lse).abs().max()) < 2e-2


CHUNK_CASES = {  # (config, query lengths, kv lengths): offsets on and off block boundaries, q_len < window, empty
    "vertical_slash_aligned": (BASE.replace(tau=0.97), [644], [900]),
    "block_sparse_unaligned": (BASE.replace(tau=1.5), [400, 37], [900, 300]),
    "varlen_offsets": (BASE.replace(dense_below=256, tau=0.97), [300, 0, 100, 20, 450], [640, 200, 200, 700, 450]),
    "jsd_window": (BASE.replace(routing="jsd", tau=0.1, last_q=32), [500, 10], [700, 400]),
    "spike_unaligned": (BASE.replace(tau=0.97, kappa=64.0, spike=0.1), [400, 37], [900, 300]),
    "rows_unaligned": (BASE.replace(tau=1.5, rows=16, budget="cumulative", gamma=0.95), [400, 37], [900, 300]),
}


@pytest.mark.parametrize("name", sorted(CHUNK_CASES))
def test_chunks_match_reference(device, name):
    cfg, lens_q, lens_k = CHUNK_CASES[name]
    _chunks_vs_reference(device, cfg, lens_q, lens_k, 4, 2, 64)


def test_chunks_gqa_and_head_dim(device):
    _chunks_vs_reference(device, BASE.replace(tau=0.97, block_size=128), [200], [600], 6, 2, 128)


def test_chunk_dense_equivalent_is_dense_and_poison(device):
    """kappa 0 keeps every block: any chunk is dense attention of its rows (LSE too); a sequence with more queries
    than keys, or a bad cu_seqlens_k, poisons the output and the LSE."""
    from crisp_trt.kernels.pipeline import crisp_cuda

    cfg = CrispConfig(block_size=64, kappa=0.0, coverage=0.0, dense_below=0, max_budget=1 << 20, min_budget=0)
    qs, k, v = (t[0].half() for t in synthetic_qkv(500, 4, 2, 64, seed=9))
    q = qs[390:]
    cu_q, cu_k = torch.tensor([0, 110], dtype=torch.int32), torch.tensor([0, 500], dtype=torch.int32)
    dev = [t.to(device) for t in (q, k, v, cu_q, cu_k)]
    out, lse = (t.cpu() for t in crisp_cuda(*dev[:4], 500, cfg, cu_seqlens_k=dev[4], return_lse=True)[:2])
    want, w_lse = reference.dense_attention(q.float(), k.float(), v.float(), return_lse=True)
    assert _rel(out, want) < 1e-2 and float((lse - w_lse).abs().max()) < 2e-2
    for bad in ([0, 100], [0, 499]):  # q_len 110 > kv_len 100; cu_k[-1] != total_k
        res = crisp_cuda(dev[0], dev[1][:bad[1]] if bad[1] < 110 else dev[1], dev[2][:bad[1]] if bad[1] < 110
                         else dev[2], dev[3], 500, cfg, cu_seqlens_k=torch.tensor(bad, dtype=torch.int32,
                                                                                  device=device), return_lse=True)
        assert torch.isnan(res[0]).all() and torch.isnan(res[1]).all(), bad


@pytest.mark.parametrize("dtype,block", [(torch.float16, 64), (torch.bfloat16, 128)])
def test_spike_map_matches_reference(device, dtype, block):
    """spike.py's map equals reference.spikes wherever the reference's share is not within 1e-3 of the threshold
    (16-bit dot operands: the pooled keys rounded to q's dtype), on varlen chunks; no spike is flagged at or above
    the diagonal of what select reads."""
    from crisp_trt.kernels.pipeline import Stages

    if device == "cpu" and dtype == torch.bfloat16:
        pytest.skip("bf16 gives garbage in the Triton 3.6 interpreter (numpy has no bf16); checked on GPU")

    cfg = BASE.replace(block_size=block, spike=0.08)
    lens_q, lens_k = [500, 260], [700, 260]
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    qs, k, _ = (t[0].to(dtype) for t in synthetic_qkv(int(cu_k[-1]), 4, 2, 64, seed=12))
    q = torch.cat([qs[int(b) - n: int(b)] for n, b in zip(lens_q, cu_k[1:])])
    st = Stages(q.to(device), k.to(device), cu_q.to(device), max(lens_k), cfg, cu_k.to(device))
    st.plan()
    flagged = 0
    for s, (q_len, kv_len) in enumerate(zip(lens_q, lens_k)):
        qf, kf = q[int(cu_q[s]):int(cu_q[s + 1])].float(), k[int(cu_k[s]):int(cu_k[s + 1])].float()
        nb, qb0 = reference.num_blocks(kv_len, block), reference.first_block(qf, kf, block)
        mass = reference.spike_mass(qf, kf, block)[:, qb0:]
        got = st._buffer("spikes")[s, :, qb0:nb, :nb].cpu().bool()
        below = torch.ones(nb, nb, dtype=torch.bool).tril(-1)[qb0:]
        clear = below & ((mass - cfg.spike).abs() > 1e-3)
        assert torch.equal(got[clear], (mass > cfg.spike)[clear])
        flagged += int((mass > cfg.spike)[:, below].sum())
    assert flagged > 0, "the case must flag some blocks"
