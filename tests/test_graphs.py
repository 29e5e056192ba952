"""crisp_trt.graphs: a graph replay gives the eager op's answer bit for bit, on fresh inputs of a captured shape,
for every result form; keys, eviction and bad inputs. The GPU tests run under scripts/device/gpu_check.sh."""
import pytest
import torch

from crisp_trt import CrispConfig, crisp_prefill_attention
from crisp_trt.graphs import GraphedPrefill

CFG = CrispConfig(block_size=64, dense_below=0)


def _qkv(n=300, b=1, h=4, hk=2, d=64, seed=0, device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, n, x, d, generator=g).to(device=device, dtype=dtype) for x in (h, hk, hk))


def test_bad_max_graphs():
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match=r"max_graphs=.*expected a positive int"):
            GraphedPrefill(bad)


def test_cpu_runs_the_op_itself():
    q, k, v = _qkv()
    graphed = GraphedPrefill()
    out, stats = graphed(q, k, v, config=CFG, return_stats=True)
    ref, ref_stats = crisp_prefill_attention(q, k, v, config=CFG, return_stats=True)
    assert torch.equal(out, ref) and torch.equal(stats.density, ref_stats.density)
    assert graphed.captures == 0 and len(graphed) == 0


def test_hf_flag_and_bench_suffix_refuse_bad_values():
    from crisp_trt.bench.accuracy import use_method
    from crisp_trt.hf import set_crisp_config

    class Model:  # set_crisp_config reads and writes only model.config
        config = type("Config", (), {})()

    with pytest.raises(ValueError, match=r"cuda_graphs='yes': expected True or False"):
        set_crisp_config(Model(), CFG, cuda_graphs="yes")
    with pytest.raises(ValueError, match=r"method='dense_graphs': the _graphs suffix applies to CRISP methods"):
        use_method(Model(), "dense_graphs", CFG)


def test_crisp_graphs_mode_needs_cuda():
    from crisp_trt.runtime import CrispModel

    model = torch.nn.Linear(2, 2)  # any module with CPU parameters
    with pytest.raises(ValueError, match=r"attention='crisp_graphs': needs a CUDA model"):
        CrispModel(model, None, {"config": CFG.to_dict(), "layers": []}, attention="crisp_graphs")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_replay_equals_eager_on_fresh_inputs(dtype):
    cfg = CrispConfig()
    graphed = GraphedPrefill()
    for seed in range(3):  # the first call captures; the next two replay on new values
        q, k, v = _qkv(n=4096, h=14, hk=2, seed=seed, device="cuda", dtype=dtype)
        out = graphed(q, k, v, config=cfg)
        ref = crisp_prefill_attention(q, k, v, config=cfg)
        assert torch.isfinite(out).all() and torch.equal(out, ref), seed
    assert graphed.captures == 1 and len(graphed) == 1


@pytest.mark.gpu
def test_strided_inputs_chunks_lse_and_stats():
    """HF hands [B, H, n, d] transposes; a chunk's queries with its keys; every result form."""
    graphed = GraphedPrefill()
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in
               _qkv(n=3000, h=8, hk=2, device="cuda", dtype=torch.bfloat16))
    assert not q.is_contiguous()
    for args in ((q, k, v), (q[:, -1000:], k, v)):
        for _ in range(2):
            out, lse, stats = graphed(*args, config=CFG, return_lse=True, return_stats=True)
            ref, ref_lse, ref_stats = crisp_prefill_attention(*args, config=CFG, return_lse=True, return_stats=True)
            assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
            assert torch.equal(stats.route, ref_stats.route) and torch.equal(stats.density, ref_stats.density)
    assert graphed.captures == 2


@pytest.mark.gpu
def test_results_are_copies_and_keys_evict():
    graphed = GraphedPrefill(max_graphs=1)
    a = _qkv(n=2048, device="cuda", dtype=torch.bfloat16)
    b = _qkv(n=2048, seed=1, device="cuda", dtype=torch.bfloat16)
    out_a = graphed(*a, config=CFG)
    keep = out_a.clone()
    graphed(*b, config=CFG)  # a replay of the same graph must not change an answer already returned
    assert torch.equal(out_a, keep)
    graphed(*_qkv(n=1024, device="cuda", dtype=torch.bfloat16), config=CFG)  # a new shape: the old graph goes
    graphed(*a, config=CFG.replace(kappa=0.5))  # a new config: another key
    assert graphed.captures == 3 and len(graphed) == 1


@pytest.mark.gpu
def test_packed_inputs_on_another_device_are_refused():
    q, k, v = (t[0] for t in _qkv(n=512, device="cuda", dtype=torch.bfloat16))
    cu = torch.tensor([0, 200, 512], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"cu_seqlens: on cpu; expected a tensor on q's device"):
        GraphedPrefill()(q, k, v, config=CFG, cu_seqlens=cu, max_seqlen=312)
    graphed = GraphedPrefill()
    for _ in range(2):
        out = graphed(q, k, v, config=CFG, cu_seqlens=cu.cuda(), max_seqlen=312)
        assert torch.equal(out, crisp_prefill_attention(q, k, v, config=CFG, cu_seqlens=cu.cuda(), max_seqlen=312))
