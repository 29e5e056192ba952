"""launch.py and contract.py: the workspace layout and launch contract shared with the plugin (its generated
header is current, computes what Python computes, and the contract's ranges are CrispConfig's), and the direct
CompiledKernel launch path."""
import inspect
import itertools
import math
import shutil
import subprocess

import numpy as np
import pytest
import torch

from crisp_trt import CrispConfig, method_config, reference
from crisp_trt.kernels import aot, contract, launch


def test_every_kernel_declares_its_constexprs_last():
    """launch.run's direct launch passes the positional arguments, then the constexprs in signature order."""
    for k in aot.KERNELS.values():  # every kernel the op launches (the plugin's list)
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
        element = torch.float32 if dtype == "input" else getattr(torch, dtype)  # input: q's dtype, f32 at most
        nbytes = math.prod(shape) * element.itemsize
        end = offset + nbytes
        if name in launch.ZEROED:
            assert offset < ws.zeroed and end <= ws.zeroed, name
            zero_end = end
        else:
            assert offset >= ws.zeroed, name
    assert zero_end <= ws.zeroed < zero_end + launch.ALIGN
    assert end <= ws.size < end + launch.ALIGN


def test_contract_header_is_current():
    """plugin/crispPrefillAttentionContract.h is what contract.py generates: a size, buffer, launch, argument,
    field or range changed in Python without regenerating fails here."""
    assert aot.CONTRACT_HEADER.read_text() == aot.render_contract(), \
        "stale plugin contract: regenerate it with python3 -m crisp_trt.kernels.aot --contract"


_INTS = (-1, 0, 1, 3, 15, 16, 17, 32, 48, 63, 64, 65, 96, 127, 128, 129, 256, 512, 1023, 1024, 1025, 16384, 65536,
         65537)
_FLOATS = (-0.5, 0.0, 0.25, 1.0, 1.5, 8.0, float("inf"), float("nan"))
_STRINGS = ("struct", "jsd", "floor", "cumulative", "bogus", "")


def _probes():
    """Field values around every range boundary, one field changed from the defaults at a time, and the
    coupled pairs (last_q / min_budget / max_budget / rows against block_size and each other)."""
    base = CrispConfig().to_dict()
    for name, value in base.items():
        for v in _STRINGS if isinstance(value, str) else _FLOATS if isinstance(value, float) else _INTS:
            yield {name: v}
    for block, last_q, lo, hi in itertools.product((64, 128), (0, 32, 128), (0, 64, 200), (64, 128, 192)):
        yield {"block_size": block, "last_q": last_q, "min_budget": lo, "max_budget": hi}
    for block, rows in itertools.product((64, 128), (0, 16, 32, 64, 128)):
        yield {"block_size": block, "rows": rows}


def _valid_config(changes: dict) -> bool:
    try:
        CrispConfig().replace(**changes)
    except (ValueError, TypeError):
        return False
    return True


def test_contract_ranges_are_crisp_configs():
    """contract.CHECKS (the plugin's range checks) accept exactly the configs CrispConfig accepts."""
    heads = contract.dims(1, 32, 8, 128)
    for changes in _probes():
        values = {**CrispConfig().to_dict(), **heads, **changes}
        assert (contract.check(values) == "") == _valid_config(changes), changes


@pytest.mark.parametrize("cfg", [CrispConfig(), method_config("flexprefill"), method_config("crisp_jsd"),
                                 CrispConfig(block_size=64, last_q=32, sink_tokens=0, min_budget=0, max_budget=64,
                                             coverage=0.0, local_blocks=3),
                                 CrispConfig(sink_tokens=300, max_budget=1000, budget="cumulative"),
                                 CrispConfig(tau=1.5, rows=16, spike=0.0), CrispConfig(tau=1.5, routing="jsd")])
def test_contract_derived_and_sizes_are_crisp_configs(cfg):
    for n in (1, 100, 128, 129, 8192, 131072, 1 << 20):
        names = {**contract.names_of(cfg), **contract.sizes(cfg, n)}
        assert (names["window"], names["sink_blocks"], names["min_blocks"], names["max_blocks"]) == \
            (cfg.window, cfg.sink_blocks, cfg.min_blocks, cfg.max_blocks)
        assert names["kappa_steps"] == len(cfg.kappas()) and names["maxk"] == cfg.max_list(names["nb"])
        assert names["estimated"] == cfg.estimated


CONTRACT_CASES = [(CrispConfig(), (32, 8, 128), 1, 8192, 1), (CrispConfig(), (32, 8, 128), 1, 131072, 16),
                  (method_config("crisp_jsd"), (9, 3, 64), 5, 13394, 1),
                  (CrispConfig(block_size=64, last_q=32, min_budget=0, max_budget=64), (1, 1, 256), 3, 1000, 4),
                  (method_config("flexprefill"), (32, 8, 128), 1, 524288, 1),
                  (CrispConfig(coverage=0.0, sink_tokens=0), (64, 64, 64), 64, 1 << 20, 1),
                  (CrispConfig(rows=16, tau=1.5, budget="cumulative"), (14, 2, 64), 2, 32768, 1)]


def _cpp_value(value) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, float):
        return "std::numeric_limits<float>::quiet_NaN()" if math.isnan(value) else \
            "std::numeric_limits<float>::infinity()" if math.isinf(value) else f"{value!r}F"
    return str(value)


def _set_params(values: dict) -> str:
    fields = dict(contract.FIELDS)
    return "".join(f"p.{aot.camel(n)} = {_cpp_value(v)}; " for n, v in values.items() if n in fields)


def _f32(x) -> str:
    return f"{float(np.float32(x)):.9g}"


def test_contract_header_computes_what_python_does(tmp_path):
    """The generated C++ (from the current contract.py) gives launch.py's sizes and workspace layout, the
    contract's launch order, grids and arguments, and its range-check verdicts, on the same inputs."""
    if shutil.which("g++") is None:
        pytest.skip("g++ is needed to compile the generated header")
    (tmp_path / "crispPrefillAttentionContract.h").write_text(aot.render_contract())
    body, expected = [], []
    for cfg, (h, hk, d), seqs, tokens, chunk in CONTRACT_CASES:
        total, total_k = tokens * seqs // chunk, tokens * seqs  # chunk > 1: queries are a part of the keys
        lse = int(chunk > 1)
        body.append("{ CrispParams p; " + _set_params({**cfg.to_dict(), **contract.dims(1, h, hk, d),
                                                       "chunked": lse, "return_lse": lse})
                    + f"CrispSizes z = crispSizes(p, {tokens}); "
                    f"CrispWorkspaceLayout w = crispWorkspaceLayout(p, {seqs}, {tokens}); "
                    'std::printf("sizes"); for (int64_t x : {z.nb, z.chunk, z.nch, z.nchCap, z.maxc, z.maxd, '
                    'z.maxk, z.routeChunk}) std::printf(" %lld", (long long) x); std::printf("\\n"); '
                    'std::printf("layout"); for (size_t o : w.offset) std::printf(" %zu", o); '
                    'std::printf(" %zu %zu\\n", w.zeroedBytes, w.total); '
                    f"for (auto const& l : crispLaunchOrder(p, z, {seqs}, {total}, {total_k})) if (l.enabled) "
                    'std::printf("launch %s %lld %lld %lld\\n", l.stage, (long long) l.grid[0], '
                    "(long long) l.grid[1], (long long) l.grid[2]); "
                    f"char* base = nullptr; for (auto const& a : crispLaunchArgs(p, z, w, base + 0, "
                    f"CrispTensors{{nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr}}, {seqs}, {total}, "
                    f"{total_k})) "
                    'if (a.type == CrispParamType::kINT32) std::printf("arg %s %lld\\n", a.name, (long long) a.integer); '
                    'else if (a.type == CrispParamType::kFLOAT32) std::printf("arg %s %.9g\\n", a.name, (double) a.real); '
                    'else std::printf("arg %s %zu\\n", a.name, (size_t) ((char const*) a.pointer - base)); }')
        z, ws = launch.workspace(seqs, h, hk, d, cfg, tokens)
        names = {**contract.names_of(cfg, **contract.dims(seqs, h, hk, d, total, total_k), max_seqlen=tokens,
                                     chunked=lse, return_lse=lse), **vars(z)}
        expected.append("sizes " + " ".join(str(v) for v in vars(z).values()))
        expected.append("layout " + " ".join(str(o) for o, _, _ in ws.layout.values()) + f" {ws.zeroed} {ws.size}")
        for stage, grid, cond in contract.LAUNCHES:
            if contract.evaluate(cond, names):
                expected.append(f"launch {stage} " + " ".join(str(contract.evaluate(g, names)) for g in grid))
        expected += [f"arg {n} 0" for n in contract.INPUT_POINTERS]
        expected += [f"arg {n} {ws.layout[b][0]}" for n, b in contract.BUFFER_POINTERS.items()]
        expected += [f"arg {n} {0 if b is None else ws.layout[b][0]}" for n, b in contract.HIDDEN_POINTERS.items()]
        expected += [f"arg {n} {_f32(contract.evaluate(e, names))}" for n, e in contract.FLOAT_ARGS.items()]
        expected += [f"arg {n} {int(contract.evaluate(e, names))}" for n, e in contract.INT_ARGS.items()]
    heads = contract.dims(1, 32, 8, 128)
    for changes in [*_probes(), {"num_heads": 0}, {"num_heads": 1025}, {"num_kv_heads": 3}, {"num_kv_heads": 64},
                    {"head_dim": 96}, {"head_dim": 256}, {"chunked": 1}, {"chunked": 2}, {"return_lse": 1},
                    {"return_lse": -1}]:
        values = {**CrispConfig().to_dict(), **heads, **changes}
        body.append("{ CrispParams p; " + _set_params(values) + 'std::printf("check %s\\n", crispCheckRanges(p).c_str()); }')
        expected.append(f"check {contract.check(values)}".rstrip())
    (tmp_path / "main.cpp").write_text('#include "crispPrefillAttentionContract.h"\n#include <cstdio>\n'
                                       "using namespace crisp;\nint main() {\n" + "\n".join(body) + "\n}\n")
    build = subprocess.run(["g++", "-std=c++17", "-Wall", "-Wextra", "-Werror", "-I", str(tmp_path), "-I",
                            str(aot.ROOT / "plugin"), str(tmp_path / "main.cpp"), "-o", str(tmp_path / "main")],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    got = subprocess.run([str(tmp_path / "main")], capture_output=True, text=True, check=True).stdout
    assert [line.rstrip() for line in got.splitlines()] == expected


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
    lse = torch.empty(n, heads, device="cuda")
    with_lse = launch_attend(*dev, block=block, lse=lse).float().cpu()  # the LSE's store does not touch the output
    assert torch.equal(with_lse, first) and torch.isfinite(lse).all()
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
    cfg = CrispConfig(block_size=64, dense_below=0)
    outs = crisp_cuda(q, k, v, cu, 300, cfg)
    storages = [t.untyped_storage().data_ptr() for t in outs]
    assert len(set(storages)) == len(outs)
    out, _, *stats = crisp_cuda(q, k, v, cu, 300, cfg, return_stats=False)  # the density's kernels skipped
    assert torch.equal(out, outs[0]) and [t.shape for t in stats] == [(0,)] * 3
    assert [t.dtype for t in stats] == [torch.int32, torch.float32, torch.float32]


@pytest.mark.gpu
def test_opcheck_on_cuda():
    """The custom op's contract (aliasing, fake tensor, schema) with the Triton kernels behind it."""
    import json

    from crisp_trt.api import _prefill_attention
    from crisp_trt.workloads.synthetic import synthetic_qkv

    q, k, v = (t[0].to("cuda", torch.bfloat16) for t in synthetic_qkv(2000, 4, 2, 64, seed=5))
    cu = torch.tensor([0, 2000], dtype=torch.int32, device="cuda")
    config = json.dumps(CrispConfig(dense_below=0).to_dict())
    for stats in (True, False):
        torch.library.opcheck(_prefill_attention, (q, k, v, cu, cu, 2000, config, False, stats))
    cu_q = torch.tensor([0, 700], dtype=torch.int32, device="cuda")  # a chunk: the last 700 of 2000, with its LSE
    torch.library.opcheck(_prefill_attention, (q[1300:].contiguous(), k, v, cu_q, cu, 2000, config, True, True))
