#!/usr/bin/env python3
"""Drive the TensorRT plugin's enqueue on torch CUDA tensors (plugin/tests/crispPluginHarness.cpp via ctypes),
and time it against the torch op. tests/test_plugin.py imports it; scripts/device/gpu_plugin.sh runs it.

    python3 tests/plugin_harness.py [--build build/plugin] [--runtime libnvinfer_lean.so.11] [--json OUT.json]
    python3 tests/plugin_harness.py --smoke      an 8k enqueue and a chunked one with the LSE (the last 1k of 8k
                                                 keys), no torch op (what compute-sanitizer runs)

For each case it compares the plugin's output (the AOT cubins of crisp_trt/kernels/, the whole sparse
pipeline) with crisp_prefill_attention's on the same inputs and config (max_seqlen = tokens, the op's default,
which is what the plugin computes; chunks: max_seqlen_k = key tokens, the LSE too): max |diff| must be 0. Then it times both (CUDA events, median of 7 after 2
warm-ups) and prints the table last.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import sys
from pathlib import Path

import torch

from crisp_trt import CrispConfig, crisp_prefill_attention
from crisp_trt import plugin as crisp_plugin

CONFIG = CrispConfig()
KINDS = {"INT32": 0, "FLOAT32": 1, "CHAR": 2}


class Harness:
    """The plugin as TensorRT would run it, on torch's current stream."""

    def __init__(self, build: Path, runtime: str | None = None):
        self.lib = ctypes.CDLL(str(build / "libcrisp_plugin_harness.so"))
        self.plugin, self.runtime = str(build / crisp_plugin.LIBRARY), runtime or ""
        self.lib.crisp_harness_create.restype = ctypes.c_void_p
        self.lib.crisp_harness_create.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int32,
                                                  ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_int32),
                                                  ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int32),
                                                  ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
                                                  ctypes.c_int32, ctypes.c_int32, ctypes.c_int64, ctypes.c_int64,
                                                  ctypes.c_int64]
        self.lib.crisp_harness_enqueue.restype = ctypes.c_int32
        self.lib.crisp_harness_enqueue.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64] + \
            [ctypes.c_void_p] * 8  # q, k, v, cu_seqlens, cu_seqlens_k, out, lse, stream
        self.lib.crisp_harness_destroy.argtypes = [ctypes.c_void_p]
        self.lib.crisp_harness_error.restype = ctypes.c_char_p

    def error(self) -> str:
        return self.lib.crisp_harness_error().decode()

    def create(self, cfg: CrispConfig, heads: int, kv_heads: int, head_dim: int, bf16: bool, max_tokens: int,
               max_batch: int, max_tokens_k: int | None = None, chunked: bool = False, lse: bool = False) -> int:
        """A runtime-phase plugin with its workspace (the build calls run first); raises with the log. chunked:
        the cu_seqlens_k input (keys up to max_tokens_k), lse: the LSE output."""
        fields = crisp_plugin.plugin_fields(cfg, heads, kv_heads, head_dim, chunked=chunked, return_lse=lse)
        n = len(fields)
        names = (ctypes.c_char_p * n)(*[name.encode() for name, _, _ in fields])
        kinds = (ctypes.c_int32 * n)(*[KINDS[kind] for _, _, kind in fields])
        data = (ctypes.c_void_p * n)(*[value.ctypes.data for _, value, _ in fields])
        lengths = (ctypes.c_int32 * n)(*[value.size for _, value, _ in fields])
        handle = self.lib.crisp_harness_create(self.runtime.encode(), self.plugin.encode(), n, names, kinds, data,
                                               lengths, int(bf16), heads, kv_heads, head_dim, int(chunked), int(lse),
                                               max_tokens, max_tokens_k or max_tokens, max_batch)
        if not handle:
            raise RuntimeError(f"harness create failed:\n{self.error()}")
        return handle

    def enqueue(self, handle: int, q, k, v, cu_seqlens, out, cu_seqlens_k=None, lse=None) -> None:
        """enqueue; cu_seqlens_k / lse only for a plugin created chunked / with lse."""
        status = self.lib.crisp_harness_enqueue(handle, q.shape[0], k.shape[0], cu_seqlens.shape[0] - 1, q.data_ptr(),
                                                k.data_ptr(), v.data_ptr(), cu_seqlens.data_ptr(),
                                                0 if cu_seqlens_k is None else cu_seqlens_k.data_ptr(), out.data_ptr(),
                                                0 if lse is None else lse.data_ptr(),
                                                torch.cuda.current_stream().cuda_stream)
        if status != 0:
            raise RuntimeError(f"enqueue returned {status}:\n{self.error()}")

    def destroy(self, handle: int) -> None:
        self.lib.crisp_harness_destroy(handle)


def inputs(lens: list[int], heads: int, kv_heads: int, d: int, dtype, seed: int = 0):
    """Packed random q, k, v and cu_seqlens on the GPU."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    total = sum(lens)
    q, k, v = (torch.randn(total, h, d, device="cuda", dtype=dtype, generator=gen) for h in (heads, kv_heads, kv_heads))
    cu = torch.tensor([0] + lens, device="cuda", dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return q, k, v, cu


def run_both(harness: Harness, lens, heads, kv_heads, d, dtype, cfg: CrispConfig = CONFIG, chunks=None):
    """(plugin output, torch op output, plugin enqueue closure, torch op closure, handle) on the same inputs.
    chunks: per sequence the query count, the last positions of its lens keys; then the plugin is chunked with
    the LSE output, and both outputs are (out, lse)."""
    q, k, v, cu = inputs(lens, heads, kv_heads, d, dtype)
    if chunks is None:
        handle = harness.create(cfg, heads, kv_heads, d, dtype == torch.bfloat16, q.shape[0], len(lens))
        out = torch.empty_like(q)
        plugin_fn = lambda: harness.enqueue(handle, q, k, v, cu, out)  # noqa: E731
        torch_fn = lambda: crisp_prefill_attention(q, k, v, config=cfg, cu_seqlens=cu)  # noqa: E731
    else:
        cu_k, q = cu, torch.cat([q[int(end) - n:int(end)] for n, end in zip(chunks, cu[1:])])
        cu = torch.tensor([0] + list(chunks), device="cuda", dtype=torch.int32).cumsum(0, dtype=torch.int32)
        handle = harness.create(cfg, heads, kv_heads, d, dtype == torch.bfloat16, q.shape[0], len(lens), k.shape[0],
                                chunked=True, lse=True)
        out = (torch.empty_like(q), torch.empty(q.shape[:2], device="cuda"))
        plugin_fn = lambda: harness.enqueue(handle, q, k, v, cu, out[0], cu_k, out[1])  # noqa: E731
        torch_fn = lambda: crisp_prefill_attention(q, k, v, config=cfg, cu_seqlens=cu, cu_seqlens_k=cu_k,  # noqa: E731
                                                   return_lse=True)
    plugin_fn()
    ref = torch_fn()
    torch.cuda.synchronize()
    return out, ref, plugin_fn, torch_fn, handle


def median_ms(fn, warmup: int = 2, repeats: int = 7) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


CASES = [("8k", [8192], 32, 8, 128, None), ("32k", [32768], 32, 8, 128, None),
         ("128k", [131072], 32, 8, 128, None), ("varlen", [1000, 4096, 37, 8197, 64], 32, 8, 128, None),
         ("8k 9/3 d64", [8192], 9, 3, 64, None), ("128k chunk 8k", [131072], 32, 8, 128, [8192])]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", type=Path, default=Path(__file__).resolve().parent.parent / "build" / "plugin")
    ap.add_argument("--runtime", default=None, help="a TensorRT runtime with getPluginRegistry (default: getCreators)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    harness = Harness(args.build, args.runtime)
    if args.smoke:
        q, k, v, cu = inputs([8192], 32, 8, 128, torch.bfloat16)
        handle, out = harness.create(CONFIG, 32, 8, 128, True, q.shape[0], 1), torch.empty_like(q)
        harness.enqueue(handle, q, k, v, cu, out)
        chunk, cu_q = q[-1024:].contiguous(), torch.tensor([0, 1024], device="cuda", dtype=torch.int32)
        chunked = harness.create(CONFIG, 32, 8, 128, True, 1024, 1, 8192, chunked=True, lse=True)
        out_c, lse = torch.empty_like(chunk), torch.empty(1024, 32, device="cuda")
        harness.enqueue(chunked, chunk, k, v, cu_q, out_c, cu, lse)
        torch.cuda.synchronize()
        harness.destroy(handle)
        harness.destroy(chunked)
        finite = all(bool(torch.isfinite(t).all()) for t in (out, out_c, lse))
        print(f"smoke: 8k enqueue and a chunked one with the LSE, finite={finite}")
        return 0 if finite else 1
    rows = []
    for name, lens, heads, kv_heads, d, chunks in CASES:
        out, ref, plugin_fn, torch_fn, handle = run_both(harness, lens, heads, kv_heads, d, torch.bfloat16,
                                                         chunks=chunks)
        out, ref = (out, ref) if chunks is None else (torch.cat([out[0].flatten(), out[1].flatten()]),
                                                      torch.cat([ref[0].flatten(), ref[1].flatten()]))
        diff = (out.float() - ref.float()).abs().max().item()
        row = {"case": name, "lens": lens, "chunks": chunks, "heads": heads, "kv_heads": kv_heads, "head_dim": d,
               "dtype": "bf16", "plugin_ms": median_ms(plugin_fn), "torch_ms": median_ms(torch_fn),
               "max_abs_diff": diff, "equal": bool(torch.equal(out, ref))}
        row["ratio"] = row["plugin_ms"] / row["torch_ms"]
        harness.destroy(handle)
        rows.append(row)
        print(f"{name}: done", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "config": CONFIG.to_dict(),
                                         "rows": rows}, indent=1))
    print(f"{'case':<12} {'plugin ms':>10} {'torch op ms':>12} {'ratio':>6} {'max |diff|':>11} {'equal':>6}")
    for r in rows:
        print(f"{r['case']:<12} {r['plugin_ms']:>10.3f} {r['torch_ms']:>12.3f} {r['ratio']:>6.3f} "
              f"{r['max_abs_diff']:>11.3g} {str(r['equal']):>6}")
    return 0 if all(r["equal"] and r["ratio"] <= 1.05 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
