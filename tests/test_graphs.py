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


def test_bad_arguments_are_named():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"config: got dict; expected a CrispConfig or None"):
        GraphedPrefill()(q, k, v, config=CFG.to_dict())
    with pytest.raises(ValueError, match=r"k: got NoneType; expected a torch.Tensor$"):
        GraphedPrefill()(q, None, v, config=CFG)
    with pytest.raises(ValueError, match=r"cu_seqlens: got list; expected a torch.Tensor or None"):
        GraphedPrefill()(q[0], k[0], v[0], config=CFG, cu_seqlens=[0, 300])


def test_hf_flag_and_bench_suffix_refuse_bad_values():
    from crisp_trt.bench.accuracy import use_method
    from crisp_trt.hf import set_cuda_graphs

    class Model:  # set_cuda_graphs reads and writes only model.config
        config = type("Config", (), {})()

    with pytest.raises(ValueError, match=r"enabled='yes': expected True or False"):
        set_cuda_graphs(Model(), "yes")
    for bad in ("dense_graphs", "_graphs"):
        with pytest.raises(ValueError, match=rf"method='{bad}': the _graphs suffix follows a CRISP method's name"):
            use_method(Model(), bad, CFG)


def test_crisp_graphs_mode_needs_cuda(tmp_path):
    from crisp_trt import runtime

    model = torch.nn.Linear(2, 2)  # CPU parameters and a config object, all CrispModel touches before the check
    model.config = type("Config", (), {})()
    with pytest.raises(ValueError, match=r"attention='crisp_graphs': needs a CUDA model"):
        runtime.CrispModel(model, None, {"config": CFG.to_dict(), "layers": []}, attention="crisp_graphs")
    with pytest.raises(ValueError, match=r"attention='crisp_graphs': needs a CUDA model \(device='cpu'\)"):
        runtime.generate_tp_modes(tmp_path / "no_artifact", ["x"], ("crisp_graphs",), device="cpu")


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
def test_results_are_copies_and_keys_evict_least_recent():
    graphed = GraphedPrefill(max_graphs=2)
    a = _qkv(n=2048, device="cuda", dtype=torch.bfloat16)
    b = _qkv(n=2048, seed=1, device="cuda", dtype=torch.bfloat16)
    out_a = graphed(*a, config=CFG)
    keep = out_a.clone()
    graphed(*b, config=CFG)  # a replay of the same graph must not change an answer already returned
    assert torch.equal(out_a, keep) and graphed.captures == 1
    short = _qkv(n=1024, device="cuda", dtype=torch.bfloat16)
    graphed(*short, config=CFG)  # keys: 2048, 1024
    graphed(*a, config=CFG)  # 2048 used last
    assert torch.equal(graphed(*a, config=CFG.replace(kappa=0.5)), crisp_prefill_attention(*a, config=CFG.replace(
        kappa=0.5)))  # a third key (shares 2048's buffers) evicts 1024, the least recently used
    assert graphed.captures == 3 and len(graphed) == 2
    graphed(*a, config=CFG)
    assert graphed.captures == 3  # still kept
    assert torch.equal(graphed(*short, config=CFG), crisp_prefill_attention(*short, config=CFG))
    assert graphed.captures == 4
    graphed.clear()
    assert len(graphed) == 0


@pytest.mark.gpu
def test_first_call_under_inference_mode():
    graphed = GraphedPrefill()
    a = _qkv(n=1024, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        graphed(*a, config=CFG)
    with torch.no_grad():
        assert torch.equal(graphed(*a, config=CFG), crisp_prefill_attention(*a, config=CFG))


@pytest.mark.gpu
def test_hf_model_with_graphs_equals_the_op():
    """A tiny Llama with per-layer configs: graphs captured per (shape, config), logits as without graphs."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from crisp_trt import graphs, hf

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    cfg._attn_implementation = "crisp"
    model = LlamaForCausalLM(cfg).eval().cuda().to(torch.bfloat16)
    hf.set_crisp_config(model, [CFG, CFG.replace(kappa=0.5), CFG])
    ids = torch.randint(0, 128, (1, 2048), generator=torch.Generator().manual_seed(1)).cuda()
    with torch.no_grad():
        eager = model(ids).logits
        hf.set_cuda_graphs(model, True)
        before = graphs.graphed_prefill_attention.captures
        first, second = model(ids).logits, model(ids).logits
    assert graphs.graphed_prefill_attention.captures - before == 2  # two distinct configs, one shape
    assert torch.equal(first, eager) and torch.equal(second, eager)


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
