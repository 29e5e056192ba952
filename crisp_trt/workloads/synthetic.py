"""Synthetic Q/K/V with controllable attention structure (DESIGN.md §6 workload b).

Logits q_i·k_j/√d are built from separate feature groups so each structure has its own knob:
  background  i.i.d. Gaussian features (near-uniform attention, noise floor ~ 1/n);
  sink        the first `sink` keys carry a direction every query reads (logit boost `sink_logit`);
  columns     `columns` planted key positions per kv head read by every query (`column_logit`);
  local       positional cos/sin features whose sum peaks at i - j = 0 (width ~ `local_width` tokens);
  slashes     positional features periodic in i - j with period `slash_period` (`slash_logit`).
Length law: the logits and the noise are given at `ref_n` tokens and change by `*_per_doubling` for
each doubling of n (linear in log2 n), so a spec fitted at 1k-8k (crisp_trt.workloads.fit) keeps the
measured trend at 8k-1M. The defaults (no trend) are hand-set; `fit.fitted_spec()` is the realistic one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class SyntheticSpec:
    sink: int = 4
    sink_logit: float = 8.0
    columns: int = 16
    column_logit: float = 10.0
    local_width: int = 64
    local_logit: float = 6.0
    slash_period: int = 0
    slash_logit: float = 0.0
    noise: float = 1.0
    ref_n: int = 1024
    sink_per_doubling: float = 0.0
    local_per_doubling: float = 0.0
    column_per_doubling: float = 0.0
    noise_per_doubling: float = 0.0

    def at(self, n: int) -> "SyntheticSpec":
        """The spec's logits and noise at length n (the length law applied; trends then zeroed)."""
        t = math.log2(max(n, 1) / self.ref_n)
        return replace(self, ref_n=n, sink_logit=max(self.sink_logit + t * self.sink_per_doubling, 0.0),
                       local_logit=max(self.local_logit + t * self.local_per_doubling, 0.0),
                       column_logit=max(self.column_logit + t * self.column_per_doubling, 0.0),
                       noise=max(self.noise + t * self.noise_per_doubling, 0.05), sink_per_doubling=0.0,
                       local_per_doubling=0.0, column_per_doubling=0.0, noise_per_doubling=0.0)


def _positional(pos: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    ang = pos[:, None].double() * freqs[None, :].double()
    return torch.cat([torch.cos(ang), torch.sin(ang)], dim=1).float()


def synthetic_qkv(n: int, heads: int, kv_heads: int, head_dim: int, *, spec: SyntheticSpec = SyntheticSpec(),
                  seed: int = 0, dtype: torch.dtype = torch.float32, device="cpu", batch: int = 1):
    """q [batch, n, H, d], k, v [batch, n, H_kv, d] with the structure of `spec`.

    Generated on `device` with a generator of that device (a 512k Llama-shaped input takes seconds on a
    GPU, minutes on a CPU), so the values are deterministic in (seed, device), not across devices."""
    if head_dim < 32:
        raise ValueError(f"head_dim={head_dim}: expected >= 32 for the synthetic feature layout")
    spec = spec.at(n)
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed)
    d = head_dim
    scale = math.sqrt(d)
    n_loc = max(8, d // 4)  # local features: their tail beyond the window is noise of std ~ 1/sqrt(n_loc) of the peak
    n_sl = 4 if spec.slash_period else 0
    n_bg = d - 2 - 2 * n_loc - 2 * n_sl
    pos = torch.arange(n, device=device)
    q = torch.zeros(batch, n, heads, d, device=device)
    k = torch.zeros(batch, n, kv_heads, d, device=device)
    # background: logit std = noise
    bg_std = math.sqrt(spec.noise * scale / math.sqrt(n_bg))
    q[..., :n_bg] = torch.randn(batch, n, heads, n_bg, generator=g, device=device) * bg_std
    k[..., :n_bg] = torch.randn(batch, n, kv_heads, n_bg, generator=g, device=device) * bg_std
    # sink (dim n_bg) and planted columns (dim n_bg + 1): `columns` distinct positions >= sink per kv head
    q[..., n_bg] = math.sqrt(spec.sink_logit * scale)
    k[:, : spec.sink, :, n_bg] = math.sqrt(spec.sink_logit * scale)
    q[..., n_bg + 1] = math.sqrt(spec.column_logit * scale)
    free = max(n - spec.sink, 1)
    cols = torch.rand(batch, kv_heads, free, generator=g, device=device).topk(min(spec.columns, free), -1).indices
    cols = (cols + spec.sink).clamp_max(n - 1)
    col_feat = k[..., n_bg + 1].transpose(1, 2)  # [batch, H_kv, n] view
    col_feat.scatter_(-1, cols, math.sqrt(spec.column_logit * scale))
    # local: sum of cosines of i - j, incommensurate (golden-ratio) frequencies up to ~ 1.2 pi / local_width
    off = n_bg + 2
    freqs = ((torch.arange(1, n_loc + 1, device=device) * 0.6180339887) % 1.0) * (1.2 * math.pi / max(spec.local_width, 1))
    feat = _positional(pos, freqs) * math.sqrt(spec.local_logit * scale / n_loc)
    q[..., off: off + 2 * n_loc] = feat[None, :, None, :]
    k[..., off: off + 2 * n_loc] = feat[None, :, None, :]
    if n_sl:
        off += 2 * n_loc
        freqs = 2 * math.pi * torch.arange(1, n_sl + 1, device=device) / spec.slash_period
        feat = _positional(pos, freqs) * math.sqrt(spec.slash_logit * scale / n_sl)
        q[..., off: off + 2 * n_sl] = feat[None, :, None, :]
        k[..., off: off + 2 * n_sl] = feat[None, :, None, :]
    v = torch.randn(batch, n, kv_heads, d, generator=g, device=device)
    return tuple(t.to(dtype=dtype) for t in (q, k, v))
