"""Pure-PyTorch reference of the CRISP pipeline: the oracle every kernel is tested against.

Written for clarity, not speed: one sequence and one head at a time, fp32 throughout, the proxy map
and the attention materialised. The block-granular semantics here ARE the specification the Triton
kernels implement (crisp_trt/kernels/README.md repeats them next to the code):

The functions carry the kernels' stage names (crisp_trt/kernels/README.md):

estimate  per head, P = softmax(scale · Q[n-L:n] · Kᵀ) (causal), v[j] = mean_i P[i, j],
          s[o] = mean_i P[i, r_i - o]; reduced per block of B to (sum, max) → vsum, vmax, ssum, smax.
route     per head, the vertical-slash keep maps: noise floor = floor_quantile of the candidate block means
          (sink and local excluded), keep a block iff its max > kappa · floor (or, budget="cumulative", by
          mass until gamma), then min/max budgets (top-k by the same score, truncated to max in ascending
          order); C_struct = vertical mass of the key blocks the selection attends for the last query
          block; kappa halves while C_struct < coverage; vertical-slash iff C_struct ≥ tau (routing="jsd":
          iff sqrt(JSD(vsum, pooled)) ≥ tau); then a head that reached coverage keeps only its heaviest
          columns and offsets that still cover it (trim_to_coverage).
select    per query block, the attended key blocks: vertical-slash → kept column blocks ∪ {qb - x : x ∈ kept
          distances}; block-sparse → pooled-Q·pooled-K row selection; always the sink, local and diagonal.
          A route can be forced (select(..., route=...)): calibration scores each head under both.
attend    causal attention restricted to the selected blocks.
plan      estimate → route → select of one sequence.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .config import CrispConfig

ROUTE_DENSE, ROUTE_VERTICAL_SLASH, ROUTE_BLOCK_SPARSE = 0, 1, 2


@dataclass
class Estimate:
    """Per head and block: vertical (key block) and slash (offset block) mass, sum and max. [H, NB]."""

    vsum: torch.Tensor
    vmax: torch.Tensor
    ssum: torch.Tensor
    smax: torch.Tensor


@dataclass
class HeadSelection:
    """Per head: kept column blocks and kept diagonal distances (bool [H, NB]), C_struct (the ladder's,
    before the trim: the value the route compares with tau), JSD, route."""

    columns: torch.Tensor
    distances: torch.Tensor
    c_struct: torch.Tensor
    jsd: torch.Tensor
    route: torch.Tensor


def num_blocks(n: int, block: int) -> int:
    return -(-n // block)


def _expand_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x.repeat_interleave(heads // x.shape[1], dim=1)


def pool_blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """Mean over each block of tokens: [n, heads, d] → [NB, heads, d] (fp32; last block partial)."""
    n = x.shape[0]
    nb = num_blocks(n, block)
    pad = nb * block - n
    xf = torch.nn.functional.pad(x.float(), (0, 0, 0, 0, 0, pad)).view(nb, block, *x.shape[1:])
    width = torch.full((nb,), float(block))
    width[-1] = n - (nb - 1) * block
    return xf.sum(1) / width.view(nb, 1, 1).to(xf.device)


def proxy_map(q: torch.Tensor, k: torch.Tensor, cfg: CrispConfig) -> torch.Tensor:
    """P [H, L, n]: softmax of the last-query window against all keys, causal inside the window."""
    n, heads, d = q.shape
    rows = min(cfg.window, n)
    kk = _expand_kv(k, heads).float()
    logits = torch.einsum("ihd,jhd->hij", q[n - rows:].float(), kk) / math.sqrt(d)
    pos_q = torch.arange(n - rows, n).view(rows, 1)
    pos_k = torch.arange(n).view(1, n)
    logits = logits.masked_fill((pos_k > pos_q).to(logits.device), float("-inf"))
    return torch.softmax(logits, dim=-1)


def _block_reduce(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    heads, n = x.shape
    nb = num_blocks(n, block)
    padded = torch.nn.functional.pad(x, (0, nb * block - n)).view(heads, nb, block)
    return padded.sum(-1), padded.amax(-1)


def estimate(q: torch.Tensor, k: torch.Tensor, cfg: CrispConfig) -> Estimate:
    """Vertical and slash mass of the proxy map, reduced per block."""
    p = proxy_map(q, k, cfg)
    heads, rows, n = p.shape
    v = p.mean(1)
    s = torch.zeros(heads, n, device=p.device)
    for i in range(rows):  # row i sits at position r = n - rows + i; offset o = r - j
        r = n - rows + i
        s[:, : r + 1] += p[:, i, : r + 1].flip(-1)
    s /= rows
    vsum, vmax = _block_reduce(v, cfg.block_size)
    ssum, smax = _block_reduce(s, cfg.block_size)
    return Estimate(vsum, vmax, ssum, smax)


def kth_smallest(x: torch.Tensor, k: int) -> torch.Tensor:
    """k-th smallest (0-indexed) of a 1-D tensor."""
    return torch.kthvalue(x, k + 1).values


def _keep(score: torch.Tensor, mass: torch.Tensor, width: torch.Tensor, always_mass: torch.Tensor,
          cfg: CrispConfig, sampled: torch.Tensor | None = None) -> torch.Tensor:
    """Keep decision over one head's (or one row's) candidate entries; returns bool like `score`.

    floor: noise floor = floor_quantile of mass/width over the candidates (or over `sampled`),
    keep iff score > kappa · floor. cumulative: keep the largest masses until gamma of the total is
    covered (always-kept mass counted first). Then budgets: at least the min_blocks top candidates by
    the rule's own statistic (score under floor, mass under cumulative); when more than max_blocks are
    kept, the max_blocks of them with the most mass under either rule — a cap ranked by a block's max
    favours one sharp diagonal over a heavier block, which costs full-sequence error (bench/NOTES.md).
    """
    m = score.numel()
    if m == 0:
        return torch.zeros(0, dtype=torch.bool, device=score.device)
    if cfg.budget == "floor":
        means = mass / width if sampled is None else sampled
        # the quantile's rank in f32, exactly as the kernels compute it
        rank = int(torch.tensor(cfg.floor_quantile, dtype=torch.float32) * (means.numel() - 1))
        floor = kth_smallest(means, rank)
        keep = score > cfg.kappa * floor
        rank_score = score
    else:
        need = cfg.gamma - float(always_mass)
        ordered = torch.sort(mass, descending=True).values
        reach = torch.nonzero(torch.cumsum(ordered, 0) >= need)
        if need <= 0:
            keep = torch.zeros_like(mass, dtype=torch.bool)
        elif reach.numel() == 0:
            keep = torch.ones_like(mass, dtype=torch.bool)
        else:
            keep = mass >= ordered[int(reach[0])]
        rank_score = mass
    if sampled is None and cfg.min_blocks > 0:
        floor_k = min(cfg.min_blocks, m)
        keep |= rank_score >= kth_smallest(rank_score, m - floor_k)
    kept = int(keep.sum())
    if kept > cfg.max_blocks:
        keep &= mass >= kth_smallest(mass[keep], kept - cfg.max_blocks)
    # ties may exceed max_blocks: keep the first max_blocks in ascending order
    keep &= torch.cumsum(keep.int(), 0) <= cfg.max_blocks
    return keep


def _widths(n: int, block: int) -> torch.Tensor:
    nb = num_blocks(n, block)
    w = torch.full((nb,), float(block))
    w[-1] = n - (nb - 1) * block
    return w


def vertical_slash_union(columns: torch.Tensor, distances: torch.Tensor, qb: int) -> torch.Tensor:
    """Key blocks attended by query block qb of a vertical-slash head (bool [NB])."""
    nb = columns.numel()
    kb = torch.arange(nb, device=columns.device)
    dist = qb - kb
    from_diag = (dist >= 0) & distances[dist.clamp(0, nb - 1)]
    return (from_diag | columns) & (kb <= qb)


def jsd_distance(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """sqrt of the Jensen–Shannon divergence (base 2, in [0, 1]) of two distributions."""
    m = 0.5 * (p + q)

    def kl(a: torch.Tensor) -> torch.Tensor:
        return torch.where(a > 0, a * torch.log2(a / m.clamp_min(1e-30)), torch.zeros_like(a)).sum()

    return torch.sqrt((0.5 * kl(p) + 0.5 * kl(q)).clamp_min(0))


def diagonals(offsets: torch.Tensor) -> torch.Tensor:
    """Kept diagonal distances of kept offset blocks: offset block ob touches distances ob and ob + 1."""
    dist = offsets.clone()
    dist[1:] |= offsets[:-1]
    return dist


def covered_mass(vs: torch.Tensor, columns: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """C_struct of a vertical-slash selection: the window's mass on the last query block's key blocks."""
    nb = vs.numel()
    return vs[vertical_slash_union(columns, diagonals(offsets), nb - 1)].sum().clamp(0, 1)


def trim_to_coverage(vs: torch.Tensor, ss: torch.Tensor, columns: torch.Tensor, offsets: torch.Tensor,
                     v_lo: int, s_lo: int, cfg: CrispConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The mass-ordered stop: drop the lightest kept columns and offsets while C_struct stays ≥ coverage.

    One threshold t for both: keep a candidate column (offset) block iff its vsum (ssum) ≥ t, t the largest
    that still covers `coverage` and leaves each of the two min(min_blocks, kept) candidates; the sink
    columns and local offsets stay. The floor rule at the ladder's last kappa says which blocks rise above
    the noise; the mass says which of them the window needs (on real Q/K/V the floor alone overshoots to
    C_struct ≈ 0.999 with many light blocks: bench/NOTES.md, session 10).
    """
    cand_c, cand_o = columns.clone(), offsets.clone()
    cand_c[:v_lo], cand_o[:s_lo] = False, False
    need_c, need_o = (min(cfg.min_blocks, int(c.sum())) for c in (cand_c, cand_o))
    masses = torch.cat([vs[cand_c], ss[cand_o]]).unique(sorted=True).flip(0)
    for t in [float("inf"), *masses.tolist()]:  # descending: the first t that holds is the largest
        cols, offs = columns & ~(cand_c & (vs < t)), offsets & ~(cand_o & (ss < t))
        if (covered_mass(vs, cols, offs) >= cfg.coverage and int((cols & cand_c).sum()) >= need_c
                and int((offs & cand_o).sum()) >= need_o):
            return cols, offs
    return columns, offsets


def route(est: Estimate, q: torch.Tensor, k: torch.Tensor, cfg: CrispConfig) -> HeadSelection:
    """Per head: noise-floor (or cumulative) selection of columns and diagonals, C_struct, route."""
    n, heads, d = q.shape
    block = cfg.block_size
    nb = num_blocks(n, block)
    width = _widths(n, block).to(est.vsum.device)
    sink, local = cfg.sink_blocks, cfg.local_blocks
    v_lo, v_hi = min(sink, nb), max(min(sink, nb), nb - 1 - local)
    s_lo = min(local, nb)
    s_hi = max(s_lo, nb - 1 - sink) if sink > 0 else nb
    columns = torch.zeros(heads, nb, dtype=torch.bool)
    distances = torch.zeros(heads, nb, dtype=torch.bool)
    c_struct = torch.zeros(heads)
    jsd = torch.zeros(heads)
    pooled_k = _expand_kv(pool_blocks(k, block), heads)  # [NB, H, d]
    rows = min(cfg.window, n)
    pooled_q = q[n - rows:].float().mean(0)  # [H, d]
    columns[:, :v_lo] = True
    offsets = torch.zeros(nb, dtype=torch.bool)
    offsets[:s_lo] = True
    for h in range(heads):
        vs, vm, ss, sm = est.vsum[h], est.vmax[h], est.ssum[h], est.smax[h]
        vs_cpu = vs.cpu()
        v_always = vs.sum() - vs[v_lo:v_hi].sum()
        s_always = ss.sum() - ss[s_lo:s_hi].sum()
        for kappa in cfg.kappas():  # the first kappa whose selection reaches C_struct ≥ coverage, else the last
            cfg_k = cfg.replace(kappa=kappa)
            columns[h, v_lo:v_hi] = _keep(vm[v_lo:v_hi], vs[v_lo:v_hi], width[v_lo:v_hi], v_always, cfg_k)
            offsets[s_lo:s_hi] = _keep(sm[s_lo:s_hi], ss[s_lo:s_hi], width[s_lo:s_hi], s_always, cfg_k)
            c_struct[h] = covered_mass(vs_cpu, columns[h], offsets)
            if c_struct[h] >= cfg.coverage:
                break
        if cfg.budget == "floor" and 0 < cfg.coverage <= c_struct[h]:  # C_struct stays the ladder's: it routes
            columns[h], offsets = trim_to_coverage(vs_cpu, ss.cpu(), columns[h], offsets, v_lo, s_lo, cfg)
        distances[h] = diagonals(offsets)
        p_est = torch.softmax(pooled_k[:, h].cpu() @ pooled_q[h].cpu() / math.sqrt(d), 0)
        jsd[h] = jsd_distance(vs_cpu, p_est)
    score = c_struct if cfg.routing == "struct" else jsd  # the route is decided before the trim
    routes = torch.where(score >= cfg.tau, ROUTE_VERTICAL_SLASH, ROUTE_BLOCK_SPARSE)
    return HeadSelection(columns, distances, c_struct, jsd, routes)


def sample_positions(lo: int, m: int, samples: int) -> torch.Tensor:
    """Fixed strided sample of a row's candidates [lo, lo + m): the block-sparse noise-floor sample."""
    count = min(samples, m)
    return lo + (torch.arange(count) * m) // count


def block_sparse_row(pooled_q: torch.Tensor, pooled_k: torch.Tensor, qb: int, cfg: CrispConfig,
                     scale: float) -> torch.Tensor:
    """Key blocks attended by query block qb of a block-sparse head (bool [NB])."""
    nb = pooled_k.shape[0]
    sink, local = cfg.sink_blocks, cfg.local_blocks
    p = torch.softmax(pooled_k[: qb + 1] @ pooled_q * scale, 0)
    keep = torch.zeros(nb, dtype=torch.bool)
    keep[: min(sink, qb + 1)] = True
    keep[max(0, qb - local): qb + 1] = True
    lo, hi = min(sink, qb + 1), max(min(sink, qb + 1), qb - local)
    m = hi - lo
    if m > 0:
        cand = p[lo:hi]
        sampled = p[sample_positions(lo, m, cfg.floor_samples)] if cfg.budget == "floor" else None
        always = p.sum() - cand.sum()
        keep[lo:hi] = _keep(cand, cand, torch.ones_like(cand), always, cfg, sampled=sampled)
    return keep


def select(q: torch.Tensor, k: torch.Tensor, sel: HeadSelection, cfg: CrispConfig,
           route: int | None = None) -> torch.Tensor:
    """Attended key blocks per head and query block: bool [H, NB(q), NB(k)], diagonal included. `route`
    (ROUTE_VERTICAL_SLASH or ROUTE_BLOCK_SPARSE) forces that route on every head instead of sel.route."""
    n, heads, d = q.shape
    block = cfg.block_size
    nb = num_blocks(n, block)
    pooled_q = pool_blocks(q, block).cpu()
    pooled_k = _expand_kv(pool_blocks(k, block), heads).cpu()
    masks = torch.zeros(heads, nb, nb, dtype=torch.bool)
    for h in range(heads):
        for qb in range(nb):
            if int(sel.route[h] if route is None else route) == ROUTE_VERTICAL_SLASH:
                masks[h, qb] = vertical_slash_union(sel.columns[h], sel.distances[h], qb)
            else:
                masks[h, qb] = block_sparse_row(pooled_q[qb, h], pooled_k[:, h], qb, cfg, 1 / math.sqrt(d))
    return masks


def plan(q: torch.Tensor, k: torch.Tensor, cfg: CrispConfig) -> tuple[HeadSelection, torch.Tensor]:
    """estimate → route → select of one sequence: the head selection and its block masks [H, NB, NB]."""
    sel = route(estimate(q, k, cfg), q, k, cfg)
    return sel, select(q, k, sel, cfg)




def causal_block_mask(n: int, heads: int, block: int) -> torch.Tensor:
    nb = num_blocks(n, block)
    return torch.ones(nb, nb, dtype=torch.bool).tril().expand(heads, nb, nb).clone()


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masks: torch.Tensor, block: int,
           first_row: int = 0) -> torch.Tensor:
    """Causal attention restricted to the masked key blocks, fp32 math, output in q's dtype.

    Rows first_row… only (the output has n − first_row rows): long sequences are checked on their last
    rows without an n × n map."""
    n, heads, d = q.shape
    kk, vv = _expand_kv(k, heads).float(), _expand_kv(v, heads).float()
    out = torch.empty(n - first_row, heads, d, dtype=torch.float32, device=q.device)
    tok_block = torch.arange(n, device=q.device) // block
    pos = torch.arange(n, device=q.device)
    causal = pos[first_row:, None] >= pos[None, :]
    for h in range(heads):
        allowed = masks[h].to(q.device)[tok_block[first_row:]][:, tok_block] & causal
        logits = (q[first_row:, h].float() @ kk[:, h].T) / math.sqrt(d)
        logits = logits.masked_fill(~allowed, float("-inf"))
        out[:, h] = torch.softmax(logits, -1) @ vv[:, h]
    return out.to(q.dtype)


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal dense attention of one sequence ([n, H, d], GQA by repetition), fp32 math."""
    n, heads, _ = q.shape
    return attend(q, k, v, causal_block_mask(n, heads, n), n)


def density(masks: torch.Tensor) -> torch.Tensor:
    """Fraction of causal blocks computed, per head."""
    nb = masks.shape[-1]
    return masks.sum((-1, -2)).float() / (nb * (nb + 1) / 2)


def crisp_sequence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: CrispConfig):
    """Whole pipeline on one sequence: (out, route[H], c_struct[H], density[H])."""
    n, heads, _ = q.shape
    if n < max(cfg.dense_below, 1):
        masks = causal_block_mask(n, heads, cfg.block_size)
        route = torch.full((heads,), ROUTE_DENSE)
        c_struct = torch.ones(heads)
    else:
        sel, masks = plan(q, k, cfg)
        route, c_struct = sel.route, sel.c_struct
    return attend(q, k, v, masks, cfg.block_size), route, c_struct, density(masks)
