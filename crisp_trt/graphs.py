"""graphed_prefill_attention: crisp_prefill_attention replayed from a CUDA graph captured once per input shape.

A call of the op costs host time beside its kernels (input checks, the workspace, about nine launches: ≈ 1 ms of
Python at 8k, where the kernels take ≈ 0.6 ms), so short prompts are host-bound. A replay costs one launch. The
first call with a new key (device, the tensors' shapes and dtypes, config, max_seqlen(s), return flags) checks the
inputs, runs the op once on a side stream (Triton compiles there) and captures it reading contiguous static copies
of the inputs; every call copies its inputs into those, replays, and returns copies of the static outputs (the
next replay overwrites them). CPU tensors run the op itself. `max_graphs` keys are kept, least recently used
dropped: prompts whose length changes every call pay a capture each and gain nothing.
"""
from __future__ import annotations

import dataclasses
from collections import OrderedDict

import torch

from .api import crisp_prefill_attention
from .config import CrispConfig
from .stats import CrispStats

TENSORS = ("q", "k", "v", "cu_seqlens", "cu_seqlens_k")


def _copy(result):
    if isinstance(result, torch.Tensor):
        return result.clone()
    if isinstance(result, CrispStats):
        return CrispStats(*(t.clone() for t in dataclasses.astuple(result)))
    return tuple(_copy(r) for r in result)


class _Captured:
    """One key's graph: static inputs, the captured op, its static outputs."""

    def __init__(self, tensors: dict, options: dict):
        self.inputs = {n: torch.empty(t.shape, dtype=t.dtype, device=t.device) for n, t in tensors.items()}
        self.copy_in(tensors)
        side = torch.cuda.Stream(tensors["q"].device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            crisp_prefill_attention(**self.inputs, **options)  # compiles the kernels and checks the inputs
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.outputs = crisp_prefill_attention(**self.inputs, **options)

    def copy_in(self, tensors: dict) -> None:
        for name, t in tensors.items():
            self.inputs[name].copy_(t)

    def __call__(self, tensors: dict):
        self.copy_in(tensors)
        self.graph.replay()
        return _copy(self.outputs)


class GraphedPrefill:
    """crisp_prefill_attention with a CUDA graph per key (see the module docstring); `captures` counts the
    graphs captured so far, `len()` the ones kept."""

    def __init__(self, max_graphs: int = 8):
        if not isinstance(max_graphs, int) or isinstance(max_graphs, bool) or max_graphs < 1:
            raise ValueError(f"max_graphs={max_graphs!r}: expected a positive int")
        self.max_graphs = max_graphs
        self.captures = 0
        self._graphs: OrderedDict = OrderedDict()

    def __len__(self) -> int:
        return len(self._graphs)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, config: CrispConfig | None = None,
                 cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None,
                 cu_seqlens_k: torch.Tensor | None = None, max_seqlen_k: int | None = None,
                 return_stats: bool = False, return_lse: bool = False):
        """crisp_prefill_attention's arguments and results."""
        options = dict(config=config if config is not None else CrispConfig(), max_seqlen=max_seqlen,
                       max_seqlen_k=max_seqlen_k, return_stats=return_stats, return_lse=return_lse)
        if not (isinstance(q, torch.Tensor) and q.is_cuda):
            return crisp_prefill_attention(q, k, v, cu_seqlens=cu_seqlens, cu_seqlens_k=cu_seqlens_k, **options)
        given = dict(q=q, k=k, v=v, cu_seqlens=cu_seqlens, cu_seqlens_k=cu_seqlens_k)
        tensors = {n: t for n, t in given.items() if t is not None}
        for name, t in tensors.items():
            if not isinstance(t, torch.Tensor) or t.device != q.device:
                where = t.device if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{name}: on {where}; expected a tensor on q's device {q.device} (a graph reads "
                                 "its inputs from device memory)")
        key = (q.device, tuple((n, tuple(t.shape), t.dtype) for n, t in tensors.items()),
               *(options[n] for n in sorted(options)))
        graph = self._graphs.get(key)
        if graph is None:
            graph = _Captured(tensors, options)
            self.captures += 1
            self._graphs[key] = graph
            while len(self._graphs) > self.max_graphs:
                self._graphs.popitem(last=False)
        else:
            self._graphs.move_to_end(key)
        return graph(tensors)  # a capture runs nothing: the first answer comes from a replay too


graphed_prefill_attention = GraphedPrefill()
