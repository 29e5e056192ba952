"""Synthetic Q/K/V with controllable attention structure (docs/design.md, "Measuring").

A SyntheticSpec names the attention statistics of `fit.attention_stats` (sink / local / top shares of
the last query rows, background floor) at `ref_n` and their length law: each share moves linearly in
log2 n (`*_slope` per doubling), ln floor likewise, clamped to valid values (`shares_at`). `logits_at`
turns them into logits at length n in closed form, so every share is set independently at any n.

Logits q_i·k_j/√d are sums over disjoint feature groups:
  sink        the first `sink` keys carry only a sink feature: logit L_s from every query, exactly;
  columns     `columns` planted positions per kv head carry only a column feature: logit L_c, exactly;
  local       m = d/2 dims of white noise averaged over `local_width` W positions, normalised: the logit
              L_l·cos(u_i, u_j) is L_l·(1 − |i−j|/W) inside the window and, beyond it, L_l times the cosine
              of independent random unit vectors (mean 0, variance 1/m): a residual that decorrelates past
              W, counted into the background (no periodic or structured tail);
  profile     (decay > 0) m_f = d/2 dims (local then takes d/4): the sum of K unit vectors of white noise
              boxed over W_k = 2W, 4W, … ≥ n positions, normalised, logit L_f·cos with E cos ≈ ρ(d) =
              mean_k (1 − d/W_k)⁺, so the mean logit falls by L_f/K = decay·ln 2 per doubling of distance:
              background mass ∝ distance^−decay, as SmolLM2's falls (~d^−1.2); its residual (std ≈
              L_f/√m_f, correlated over W_k keys) is part of the background;
  slashes     cosines periodic in i − j (`slash_period`, `slash_logit`), off by default and outside the
              inversion (their mass shows up as local / top / background);
  background  unit random vectors in the remaining n_bg dims: logit σ_g·√n_bg·cos, variance σ_g².
Inversion: with M_m(a) = E[exp(a·cos)] for random unit vectors in R^m (exact by quadrature), a row of
N_b background keys has mass N_b·M_bg·M_loc and median logit 0, so floor = 1 / (M_bg·M_loc); a share x of
mass is (x / background_share) times the background mass. The profile multiplies a key's mean mass by
F(d) = E e^{L_f·cos}: the local and background masses are sums of F over their distances, and the floor
takes e^{median L_f·ρ} as the median (approximate: `fit.fit_at` calibrates). `fit.py` fits the spec to
SmolLM2.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
import torch.nn.functional as F

_SLASH_FREQS = 4  # cos/sin pairs of the slash feature


@dataclass(frozen=True)
class SyntheticSpec:
    sink: int = 4  # sink keys
    columns: int = 16  # planted retrieval columns per kv head
    local_width: int = 64  # local window W (keys before the query)
    sink_share: float = 0.3  # attention mass shares of the last query rows at ref_n
    local_share: float = 0.3
    top_share: float = 0.15
    floor: float = 0.3  # median / mean mass of a background key (1 = uniform)
    ref_n: int = 1024
    sink_slope: float = 0.0  # share change per doubling of n
    local_slope: float = 0.0
    top_slope: float = 0.0
    floor_slope: float = 0.0  # ln(floor) change per doubling of n
    decay: float = 0.0  # distance profile: mean logit falls by decay·ln 2 per doubling of distance past W
    decay_slope: float = 0.0  # decay change per doubling of n
    slash_period: int = 0
    slash_logit: float = 0.0

    def shares_at(self, n: int) -> dict:
        """{sink_share, local_share, top_share, background_share, floor} of the length law at n. Shares are
        clamped to [0, 1] and scaled to leave a background of at least 1 %; the floor to (0, 1)."""
        t = math.log2(max(n, 1) / self.ref_n)
        out = {s: min(max(getattr(self, s) + t * getattr(self, s.replace("share", "slope")), 0.0), 1.0)
               for s in ("sink_share", "local_share", "top_share")}
        total = sum(out.values())
        if total > 0.99:
            out = {s: v * 0.99 / total for s, v in out.items()}
        out["background_share"] = 1.0 - sum(out.values())
        out["floor"] = min(math.exp(math.log(self.floor) + t * self.floor_slope), 0.999)
        out["decay"] = max(self.decay + t * self.decay_slope, 0.0)
        return out

    def at(self, n: int) -> "SyntheticSpec":
        """The spec with the length law applied at n (ref_n = n, slopes zero)."""
        sh = self.shares_at(n)
        return replace(self, ref_n=n, sink_share=sh["sink_share"], local_share=sh["local_share"],
                       top_share=sh["top_share"], floor=sh["floor"], decay=sh["decay"], sink_slope=0.0,
                       local_slope=0.0, top_slope=0.0, floor_slope=0.0, decay_slope=0.0)


class Logits(NamedTuple):
    sink: float  # L_s
    column: float  # L_c
    local: float  # L_l (logit at distance 0)
    background: float  # σ_g, std of the background-feature logit
    far: float  # L_f, logit of the distance-profile feature at distance 0


def _dims(head_dim: int, spec: SyntheticSpec) -> tuple[int, int, int]:
    """(local dims m, profile dims m_f, background dims n_bg); dims 0 and 1 are sink and column, then
    local, profile, slashes; the background takes the last n_bg."""
    m, m_f = (head_dim // 4, head_dim // 2) if spec.decay else (head_dim // 2, 0)
    n_bg = head_dim - 2 - m - m_f - (2 * _SLASH_FREQS if spec.slash_period else 0)
    if n_bg < 4:
        raise ValueError(f"head_dim={head_dim}: expected >= 32 for the synthetic feature layout")
    return m, m_f, n_bg


def far_widths(n: int, w: int) -> list[int]:
    """Box widths 2W, 4W, … up to the first ≥ n of the distance-profile feature."""
    out = []
    while 2 * w << len(out) < 2 * n:
        out.append(2 * w << len(out))
    return out


def _far_profile(n: int, w: int, distances: torch.Tensor) -> torch.Tensor:
    """ρ(d): mean over the widths W_k of (1 − d/W_k)⁺, the expected profile cosine at distance d."""
    widths = torch.tensor(far_widths(n, w) or [1], dtype=torch.float64)
    return (1 - distances[:, None] / widths).clamp_min(0).mean(1)


@functools.lru_cache(maxsize=None)
def _cosine_grid(m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Midpoints x of [-1, 1] and the log quadrature weights of the cosine density ∝ (1−x²)^((m−3)/2)."""
    x = (torch.arange(2048, dtype=torch.float64) + 0.5) / 1024 - 1.0
    logw = 0.5 * (m - 3) * torch.log1p(-x * x)
    return x, logw - torch.logsumexp(logw, 0)


def log_mgf(a, m: int) -> torch.Tensor:
    """ln E[exp(a·x)], x the cosine of two independent random unit vectors of R^m; a a float or tensor."""
    x, logw = _cosine_grid(m)
    return torch.logsumexp(torch.as_tensor(a, dtype=torch.float64)[..., None] * x + logw, -1)


def _bisect(f, lo: float, hi: float, want: float, steps: int = 60) -> float:
    """x in [lo, hi] with f(x) = want, f increasing (clamped to the ends)."""
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if f(mid) < want else (lo, mid)
    return 0.5 * (lo + hi)


def logits_at(spec: SyntheticSpec, n: int, head_dim: int) -> Logits:
    """The logits that give spec.shares_at(n) at length n (closed form; see the module docstring)."""
    sh, (m, m_f, n_bg), w = spec.shares_at(n), _dims(head_dim, spec), spec.local_width
    n_b = max(n - 32 - spec.sink - w - spec.columns, 1)  # background keys of the last 64 rows, on average
    b, floor = sh["background_share"], sh["floor"]
    kappa = 1.0 - torch.arange(w, dtype=torch.float64) / w  # E cos(u_i, u_{i-d}) inside the window
    # distance profile: ln F(d) = ln E e^{L_f·cos_f(d)} at the window's and the background's distances
    far = sh["decay"] * len(far_widths(n, w)) * math.log(2) if m_f else 0.0
    rho_loc = _far_profile(n, w, torch.arange(w, dtype=torch.float64))
    rho_bg = _far_profile(n, w, torch.arange(w, max(n - 32 - spec.sink, w + 1), dtype=torch.float64))
    ln_f_loc = far * rho_loc + log_mgf(far * (1 - rho_loc ** 2), max(m_f, 1))
    ln_f_bg = far * rho_bg + log_mgf(far * (1 - rho_bg ** 2), max(m_f, 1))
    ln_s_bg = float(torch.logsumexp(ln_f_bg, 0)) + math.log(n_b / rho_bg.numel())  # ln Σ_bg F

    def local_over_bg(L):  # ln(Σ_{d<W} E e^{L·cos_d}·F(d) / (M_loc(L)·Σ_bg F)), cos_d ≈ κ_d + (1 − κ_d²)·x
        terms = L * kappa + log_mgf(L * (1 - kappa ** 2), m) + ln_f_loc
        return float(torch.logsumexp(terms, 0) - log_mgf(L, m)) - ln_s_bg

    want = math.log(max(sh["local_share"], 1e-9) / b)
    local = _bisect(local_over_bg, 0.0, 0.9 * m, want) if want > local_over_bg(0.0) else 0.0
    # floor = median / mean ≈ e^{median of L_f·ρ} / (M_bg·M_loc·Σ_bg F / N_b)
    ln_med = float((far * rho_bg).median())
    bg_want = ln_med + math.log(n_b) - ln_s_bg - math.log(floor) - float(log_mgf(local, m))
    sigma = 0.0 if bg_want <= 0 else _bisect(
        lambda s: float(log_mgf(s * math.sqrt(n_bg), n_bg)), 0.0, 20.0, bg_want)
    ln_bg_mass = float(log_mgf(sigma * math.sqrt(n_bg), n_bg) + log_mgf(local, m)) + ln_s_bg

    def structured(share, count):  # count keys holding `share`: count·e^L = share/b · background mass
        return math.log(max(share, 1e-9) / (b * max(count, 1))) + ln_bg_mass

    return Logits(structured(sh["sink_share"], spec.sink), structured(sh["top_share"], spec.columns), local, sigma,
                  far)


def _unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def _signed_root(x: float) -> float:
    return math.copysign(math.sqrt(abs(x)), x)


def _far_noise(rows: int, n: int, dims: int, widths: list[int], g, device) -> torch.Tensor:
    """[rows, n, dims]: the sum over widths W_k of unit vectors of white noise boxed over W_k positions
    (running sums, O(n) per width), so cos(f_i, f_j) ≈ mean_k (1 − |i−j|/W_k)⁺: a mean logit falling by
    L_f / K per doubling of distance, mass ∝ distance^−decay."""
    acc = torch.zeros(rows, n, dims, device=device)
    for width in widths:
        noise = torch.randn(rows, n + width - 1, dims, generator=g, device=device, dtype=torch.float64)
        c = F.pad(noise.cumsum(1), (0, 0, 1, 0))
        acc += _unit((c[:, width:] - c[:, :-width]).float())
    return acc


def synthetic_qkv(n: int, heads: int, kv_heads: int, head_dim: int, *, spec: SyntheticSpec = SyntheticSpec(),
                  seed: int = 0, dtype: torch.dtype = torch.float32, device="cpu", batch: int = 1):
    """q [batch, n, H, d], k, v [batch, n, H_kv, d] with the structure of `spec` at length n.

    Generated on `device` with a generator of that device in O(n·d) (a 512k Llama-shaped bf16 input
    takes 0.07 s on an H200), so the values are deterministic in (seed, device), not across devices."""
    d, w, group = head_dim, spec.local_width, heads // kv_heads
    m, m_f, n_bg = _dims(d, spec)
    lg = logits_at(spec, n, d)
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed)
    r = d ** 0.25  # q and k each carry d^(1/4), so q·k/√d is the product of the unscaled features
    q = torch.zeros(batch, n, heads, d, device=device)
    k = torch.zeros(batch, n, kv_heads, d, device=device)
    bg = slice(d - n_bg, d)
    bg_q = _unit(torch.randn(batch, n, heads, n_bg, generator=g, device=device))
    q[..., bg] = bg_q * (lg.background * n_bg ** 0.5 * r)
    k[..., bg] = _unit(torch.randn(batch, n, kv_heads, n_bg, generator=g, device=device)) * r
    noise = torch.randn(batch * kv_heads, m, n + w - 1, generator=g, device=device)
    u = _unit(F.avg_pool1d(noise, w, stride=1).view(batch, kv_heads, m, n).permute(0, 3, 1, 2)) * (lg.local ** 0.5 * r)
    k[..., 2: 2 + m] = u
    q[..., 2: 2 + m] = u[:, :, :, None].expand(batch, n, kv_heads, group, m).reshape(batch, n, heads, m)
    if m_f:
        f = _unit(_far_noise(batch * kv_heads, n, m_f, far_widths(n, w), g, device))
        f = f.view(batch, kv_heads, n, m_f).transpose(1, 2) * (lg.far ** 0.5 * r)
        k[..., 2 + m: 2 + m + m_f] = f
        q[..., 2 + m: 2 + m + m_f] = f[:, :, :, None].expand(batch, n, kv_heads, group, m_f).reshape(
            batch, n, heads, m_f)
    if spec.slash_period:
        freqs = 2 * math.pi * torch.arange(1, _SLASH_FREQS + 1, device=device) / spec.slash_period
        ang = torch.arange(n, device=device)[:, None].double() * freqs.double()
        feat = torch.cat([ang.cos(), ang.sin()], 1).float() * math.sqrt(spec.slash_logit / _SLASH_FREQS) * r
        q[..., 2 + m + m_f: 2 + m + m_f + 2 * _SLASH_FREQS] = feat[None, :, None]
        k[..., 2 + m + m_f: 2 + m + m_f + 2 * _SLASH_FREQS] = feat[None, :, None]
    # sink and planted columns: those keys carry their own feature only, so their logits are exact
    free = max(n - spec.sink, 1)
    cols = torch.rand(batch, kv_heads, free, generator=g, device=device).topk(min(spec.columns, free), -1).indices
    cols = (cols + spec.sink).clamp_max(n - 1).transpose(1, 2)  # [batch, C, H_kv]
    k[:, : spec.sink] = 0.0
    k.scatter_(1, cols[..., None].expand(-1, -1, -1, d), 0.0)
    q[..., 0] = abs(lg.sink) ** 0.5 * r
    k[:, : spec.sink, :, 0] = _signed_root(lg.sink) * r
    q[..., 1] = abs(lg.column) ** 0.5 * r
    k[..., 1].scatter_(1, cols, _signed_root(lg.column) * r)
    v = torch.randn(batch, n, kv_heads, d, generator=g, device=device)
    return tuple(t.to(dtype=dtype) for t in (q, k, v))
