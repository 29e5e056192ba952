"""launch.py: the workspace layout (shared with the plugin) and the direct CompiledKernel launch path."""
import inspect
import math
import sys
from pathlib import Path

import pytest
import torch

from crisp_trt import CrispConfig, reference
from crisp_trt.kernels import launch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))


def test_every_kernel_declares_its_constexprs_last():
    """launch.run's direct launch passes the positional arguments, then the constexprs in signature order."""
    import aot_kernels  # every kernel the op launches (the plugin's list)

    for k in aot_kernels.KERNELS.values():
        flags = ["constexpr" in str(p.annotation) for p in inspect.signature(k.fn).parameters.values()]
        assert flags == sorted(flags), launch.name(k)
        assert launch.constexpr_names(k) == tuple(
            p.name for p in inspect.signature(k.fn).parameters.values() if "constexpr" in str(p.annotation))


@pytest.mark.parametrize("seqs,heads,kv_heads,d,tokens,cfg", [
    (1, 32, 8, 128, 8192, CrispConfig()), (5, 9, 3, 64, 13394, CrispConfig(routing="jsd", tau=0.1)),
    (3, 1, 1, 256, 1000, CrispConfig(block_size=64, last_q=32, min_budget=0, max_budget=64))])
def test_workspace_layout(seqs, heads, kv_heads, d, tokens, cfg):
    """Every buffer 256-aligned, in buffers' order, no overlap; the zeroed prefix is exactly the ZEROED ones."""
    shapes = launch.buffers(seqs, heads, kv_heads, d, cfg, launch.Sizes.of(tokens, cfg))
    ws = launch.Workspace.of(shapes)
    assert list(ws.layout) == list(shapes)
    end, zero_end = 0, 0
    for name, (offset, shape, dtype) in ws.layout.items():
        assert offset % launch.ALIGN == 0 and offset >= end, name
        nbytes = math.prod(shape) * getattr(torch, dtype).itemsize
        end = offset + nbytes
        if name in launch.ZEROED:
            assert offset < ws.zeroed and end <= ws.zeroed, name
            zero_end = end
        else:
            assert offset >= ws.zeroed, name
    assert zero_end <= ws.zeroed < zero_end + launch.ALIGN
    assert end <= ws.size < end + launch.ALIGN


@pytest.mark.gpu
def test_direct_launch_equals_the_jit_and_keys_on_alignment():
    """A repeated launch (the CompiledKernel path) equals the first (the JIT's); a misaligned view of q is a
    different specialisation, compiled on its own and still right."""
    from crisp_trt.kernels.attend import attend as launch_attend
    from crisp_trt.kernels.pipeline import lists_from_masks

    n, heads, kv_heads, d, block = 1000, 4, 2, 64, 64
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(n, h, d, generator=g).to(torch.bfloat16) for h in (heads, kv_heads, kv_heads))
    nb = reference.num_blocks(n, block)
    masks = (torch.rand(heads, nb, nb, generator=g) < 0.5).tril() | torch.eye(nb, dtype=torch.bool)
    idx, counts = lists_from_masks([masks], nb, nb)
    cu, dense = torch.tensor([0, n], dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    want = reference.attend(q, k, v, masks, block).float()
    dev = [t.cuda() for t in (q, k, v, cu, idx, counts, dense)]
    first = launch_attend(*dev, block=block).float().cpu()
    again = launch_attend(*dev, block=block).float().cpu()
    assert torch.equal(first, again)
    shifted = torch.empty(q.numel() + 1, dtype=q.dtype, device="cuda")[1:].view(q.shape)
    shifted.copy_(dev[0])
    assert shifted.data_ptr() % 16 != 0
    odd = launch_attend(shifted, *dev[1:], block=block).float().cpu()
    for got in (first, odd):
        assert torch.isfinite(got).all()
        assert float((got - want).norm() / want.norm()) < 1e-2


def test_crisp_cuda_outputs_share_no_storage(device):
    """crisp::prefill_attention may not return tensors that alias each other or the workspace's views."""
    from crisp_trt.kernels.pipeline import crisp_cuda
    from crisp_trt.workloads.synthetic import synthetic_qkv

    q, k, v = (t[0].to(device) for t in synthetic_qkv(300, 2, 1, 64, seed=3))
    cu = torch.tensor([0, 300], dtype=torch.int32, device=device)
    outs = crisp_cuda(q, k, v, cu, 300, CrispConfig(block_size=64, dense_below=0))
    storages = [t.untyped_storage().data_ptr() for t in outs]
    assert len(set(storages)) == len(outs)


@pytest.mark.gpu
def test_opcheck_on_cuda():
    """The custom op's contract (aliasing, fake tensor, schema) with the Triton kernels behind it."""
    import json

    from crisp_trt.api import _prefill_attention
    from crisp_trt.workloads.synthetic import synthetic_qkv

    q, k, v = (t[0].to("cuda", torch.bfloat16) for t in synthetic_qkv(2000, 4, 2, 64, seed=5))
    cu = torch.tensor([0, 2000], dtype=torch.int32, device="cuda")
    torch.library.opcheck(_prefill_attention, (q, k, v, cu, 2000, json.dumps(CrispConfig(dense_below=0).to_dict())))
