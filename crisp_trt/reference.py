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
          distances}; block-sparse → row selection over the pooled-Q·pooled-K softmax, or (rows > 0) over the
          mean attention of `rows` strided rows of the query block per key block; always the sink, local and diagonal;
          then (spike > 0) the spikes: earlier key blocks some row of the query block would give more than
          `spike` of its attention (softmax of q_i · k̄_j · scale over the key blocks j ≤ qb, k̄ a block's mean
          key), at most max_blocks of them beyond the route's, lowest first.
          A route can be forced (select(..., route=...)): calibration scores each head under both.
attend    causal attention restricted to the selected blocks.
plan      estimate → route → select of one sequence.

Chunked prefill: q may be the last q_len ≤ kv_len rows of the sequence whose keys k holds (offset = kv_len − q_len,
query row i at absolute position offset + i, attending keys j ≤ offset + i). Blocks stay absolute (key block
j // B, query block (offset + i) // B) and the plan is the prefix's: the proxy window is the chunk's last
min(L, q_len) rows (the sequence's last positions), route depends on kv_len only, a query block's pooled q
pools the chunk's rows in it, and select / attend cover only the query blocks the chunk touches (the first
one partial when offset % B ≠ 0). q_len == kv_len is the one-call case. `return_lse` also gives the natural-log
log-sum-exp of the scaled logits over the attended keys per row and head (attend: how to merge two parts).
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


def pool_blocks(x: torch.Tensor, block: int, first: int = 0) -> torch.Tensor:
    """Mean over each block of tokens whose rows x holds, x's rows sitting at positions first, first + 1, ...:
    [m, heads, d] → [NB(first + m) − first // block, heads, d], blocks first // block onwards (fp32; a partial
    first or last block is divided by the rows it has)."""
    lead = first % block
    n = lead + x.shape[0]
    nb = num_blocks(n, block)
    pad = nb * block - n
    xf = torch.nn.functional.pad(x.float(), (0, 0, 0, 0, lead, pad)).view(nb, block, *x.shape[1:])
    width = torch.full((nb,), float(block))
    width[-1] = n - (nb - 1) * block
    width[0] -= lead
    return xf.sum(1) / width.view(nb, 1, 1).to(xf.device)


def first_block(q: torch.Tensor, k: torch.Tensor, block: int) -> int:
    """The first query block a chunk touches: (kv_len − q_len) // block (0 for a one-call prefill)."""
    return (k.shape[0] - q.shape[0]) // block


def proxy_map(q: torch.Tensor, k: torch.Tensor, cfg: CrispConfig) -> torch.Tensor:
    """P [H, L, kv_len]: softmax of the last-query window (the chunk's last L = min(window, q_len) rows, at
    positions kv_len − L …) against all keys, causal."""
    q_len, heads, d = q.shape
    n = k.shape[0]
    rows = min(cfg.window, q_len)
    kk = _expand_kv(k, heads).float()
    logits = torch.einsum("ihd,jhd->hij", q[q_len - rows:].float(), kk) / math.sqrt(d)
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
    """Per head: noise-floor (or cumulative) selection of columns and diagonals, C_struct, route (of the
    kv_len-token prefix: q may be its last rows)."""
    q_len, heads, d = q.shape
    n = k.shape[0]
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
    rows = min(cfg.window, q_len)
    pooled_q = q[q_len - rows:].float().mean(0)  # [H, d]
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


def block_sparse_row(p: torch.Tensor, qb: int, cfg: CrispConfig) -> torch.Tensor:
    """Key blocks attended by query block qb of a block-sparse head (bool [NB]), given p [NB]: the row's estimated
    attention per key block (0 after qb): the pooled softmax (pooled_row) or the sampled rows' (rows_mass)."""
    nb = p.numel()
    sink, local = cfg.sink_blocks, cfg.local_blocks
    keep = torch.zeros(nb, dtype=torch.bool)
    keep[: min(sink, qb + 1)] = True
    keep[max(0, qb - local): qb + 1] = True
    lo, hi = min(sink, qb + 1), max(min(sink, qb + 1), qb - local)
    m = hi - lo
    if m > 0:
        cand = p[lo:hi]
        sampled = p[sample_positions(lo, m, cfg.floor_samples)] if cfg.budget == "floor" else None
        always = p[: qb + 1].sum() - cand.sum()
        keep[lo:hi] = _keep(cand, cand, torch.ones_like(cand), always, cfg, sampled=sampled)
    return keep


def pooled_row(pooled_q: torch.Tensor, pooled_k: torch.Tensor, qb: int, scale: float) -> torch.Tensor:
    """f32 [NB]: softmax over the key blocks j ≤ qb of pooled q[qb] · pooled k[j] · scale, 0 after qb."""
    p = torch.zeros(pooled_k.shape[0])
    p[: qb + 1] = torch.softmax(pooled_k[: qb + 1] @ pooled_q * scale, 0)
    return p


def sampled_rows(qb, block: int, rows: int, first: int, n: int) -> torch.Tensor:
    """The `rows` positions [..., rows] query block(s) qb (an int or a tensor) sample: the last of every
    block / rows, clamped to the chunk's positions [first, n) (a partial block repeats its last or first row)."""
    step = block // rows
    qb = torch.as_tensor(qb)
    return (qb[..., None] * block + step * torch.arange(1, rows + 1, device=qb.device) - 1).clamp(first, n - 1)


def rows_mass(q: torch.Tensor, k: torch.Tensor, cfg: CrispConfig) -> torch.Tensor:
    """f32 [H, NB, NB]: per head and query block qb the chunk touches, the mean over its sampled rows (sampled_rows)
    of their exact causal softmax summed per key block; rows of other query blocks stay 0."""
    q_len, heads, d = q.shape
    n, block = k.shape[0], cfg.block_size
    nb, first = num_blocks(n, block), n - q_len
    kk = _expand_kv(k, heads).transpose(0, 1)  # [H, n, d]
    out = torch.zeros(heads, nb, nb)
    for qb in range(first // block, nb):
        pos = sampled_rows(qb, block, cfg.rows, first, n).to(q.device)
        keys = int(pos.max()) + 1
        future = torch.arange(keys, device=q.device)[None] > pos[:, None]
        mass = dense_rows(q[pos - first].transpose(0, 1), kk[:, :keys], future, block)[1]  # [H, rows, ≤ NB]
        out[:, qb, :mass.shape[-1]] = mass.mean(1).cpu()
    return out


def dense_rows(q_rows: torch.Tensor, k: torch.Tensor, future: torch.Tensor, block: int):
    """Causal softmax rows p [..., R, n] (fp32) of q_rows [..., R, d] against k [..., n, d] (leading dims: heads,
    broadcast; future: bool [R, n], masked) and their mass per key block [..., R, NB]."""
    n, d = k.shape[-2:]
    nkb = num_blocks(n, block)
    logits = (q_rows.float() @ k.float().transpose(-1, -2)) / math.sqrt(d)
    p = torch.softmax(logits.masked_fill(future, float("-inf")), -1)
    return p, torch.nn.functional.pad(p, (0, nkb * block - n)).view(*p.shape[:-1], nkb, block).sum(-1)


def spike_mass(q: torch.Tensor, k: torch.Tensor, block: int, rows_per_step: int = 2048) -> torch.Tensor:
    """f32 [H, NB, NB]: per head, absolute query block qb and earlier key block kb < qb, the most attention any of
    the chunk's rows in qb would give kb, estimated per row i as softmax over the key blocks j ≤ qb of
    q_i · k̄_j / sqrt(d) (k̄_j: block j's mean key; the row's own block with its whole mean). 0 elsewhere. Costs
    ≈ 1/B of dense attention: the pooled keys stand in for the block's keys."""
    q_len, heads, d = q.shape
    n = k.shape[0]
    pooled_k = _expand_kv(pool_blocks(k, block), heads)  # [NB, H, d]
    nb = pooled_k.shape[0]
    out = torch.zeros(heads, nb, nb, device=q.device)
    kb = torch.arange(nb, device=q.device)
    for lo in range(0, q_len, rows_per_step):
        qb = torch.arange(n - q_len + lo, n - q_len + min(q_len, lo + rows_per_step), device=q.device) // block
        logits = torch.einsum("rhd,khd->hrk", q[lo:lo + rows_per_step].float(), pooled_k) / math.sqrt(d)
        logits = logits.masked_fill(kb[None, None] > qb[None, :, None], float("-inf"))
        p = torch.softmax(logits, -1) * (kb[None, None] < qb[None, :, None])
        out.scatter_reduce_(1, qb[None, :, None].expand_as(p), p, "amax")
    return out


def spikes(q: torch.Tensor, k: torch.Tensor, cfg: CrispConfig) -> torch.Tensor:
    """bool [H, NB, NB]: the key blocks spike_mass puts above cfg.spike (none when cfg.spike == 0)."""
    if cfg.spike == 0:
        nb = num_blocks(k.shape[0], cfg.block_size)
        return torch.zeros(q.shape[1], nb, nb, dtype=torch.bool)
    return (spike_mass(q, k, cfg.block_size) > cfg.spike).cpu()


def add_spikes(masks: torch.Tensor, extra: torch.Tensor, max_blocks: int) -> torch.Tensor:
    """masks ∪ the first max_blocks (lowest) blocks of each row of `extra` that masks does not hold yet."""
    new = extra & ~masks
    return masks | (new & (torch.cumsum(new.int(), -1) <= max_blocks))


def select(q: torch.Tensor, k: torch.Tensor, sel: HeadSelection, cfg: CrispConfig,
           route: int | None = None) -> torch.Tensor:
    """Attended key blocks per head and absolute query block: bool [H, NB, NB] (NB of kv_len), diagonal included;
    rows of query blocks the chunk q does not touch stay False. `route` (ROUTE_VERTICAL_SLASH or
    ROUTE_BLOCK_SPARSE) forces that route on every head instead of sel.route."""
    heads, d = q.shape[1:]
    block = cfg.block_size
    nb = num_blocks(k.shape[0], block)
    qb0 = first_block(q, k, block)
    pooled_q = pool_blocks(q, block, k.shape[0] - q.shape[0]).cpu()  # rows: query blocks qb0 …
    pooled_k = _expand_kv(pool_blocks(k, block), heads).cpu()
    sampled = rows_mass(q, k, cfg) if cfg.rows > 0 else None
    masks = torch.zeros(heads, nb, nb, dtype=torch.bool)
    for h in range(heads):
        for qb in range(qb0, nb):
            if int(sel.route[h] if route is None else route) == ROUTE_VERTICAL_SLASH:
                masks[h, qb] = vertical_slash_union(sel.columns[h], sel.distances[h], qb)
            else:
                p = (sampled[h, qb] if sampled is not None
                     else pooled_row(pooled_q[qb - qb0, h], pooled_k[:, h], qb, 1 / math.sqrt(d)))
                masks[h, qb] = block_sparse_row(p, qb, cfg)
    if cfg.spike > 0:
        masks[:, qb0:] = add_spikes(masks[:, qb0:], spikes(q, k, cfg)[:, qb0:], cfg.max_blocks)
    return masks


def block_sparse_heads(heads: int, nb: int) -> HeadSelection:
    """The route of a config without the vertical-slash estimate (not cfg.estimated): every head block-sparse,
    no columns or diagonals, C_struct and JSD 0."""
    none = torch.zeros(heads, nb, dtype=torch.bool)
    return HeadSelection(none, none.clone(), torch.zeros(heads), torch.zeros(heads),
                         torch.full((heads,), ROUTE_BLOCK_SPARSE))


def plan(q: torch.Tensor, k: torch.Tensor, cfg: CrispConfig) -> tuple[HeadSelection, torch.Tensor]:
    """estimate → route → select of one sequence: the head selection and its block masks [H, NB, NB]."""
    if cfg.estimated:
        sel = route(estimate(q, k, cfg), q, k, cfg)
    else:
        sel = block_sparse_heads(q.shape[1], num_blocks(k.shape[0], cfg.block_size))
    return sel, select(q, k, sel, cfg)


def causal_block_mask(n: int, heads: int, block: int) -> torch.Tensor:
    nb = num_blocks(n, block)
    return torch.ones(nb, nb, dtype=torch.bool).tril().expand(heads, nb, nb).clone()


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masks: torch.Tensor, block: int,
           first_row: int = 0, return_lse: bool = False):
    """Causal attention restricted to the masked key blocks, fp32 math, output in q's dtype.

    q holds the last q_len ≤ kv_len rows of the sequence (row i at position kv_len − q_len + i); rows
    first_row… only (the output has q_len − first_row rows): long sequences are checked on their last rows
    without an n × n map. With return_lse also the log-sum-exp [rows, H] (f32, natural log) of the scaled
    logits over the attended keys. Two results over disjoint key sets merge into the one over their union:
    lse = logaddexp(lse_a, lse_b), out = exp(lse_a − lse) · out_a + exp(lse_b − lse) · out_b (merge_partials)."""
    q = q[first_row:]
    rows, heads, d = q.shape
    n = k.shape[0]
    kk, vv = _expand_kv(k, heads).float(), _expand_kv(v, heads).float()
    out = torch.empty(rows, heads, d, dtype=torch.float32, device=q.device)
    lse = torch.empty(rows, heads, dtype=torch.float32, device=q.device)
    pos_k = torch.arange(n, device=q.device)
    pos_q = pos_k[n - rows:]
    causal = pos_q[:, None] >= pos_k[None, :]
    for h in range(heads):
        allowed = masks[h].to(q.device)[pos_q // block][:, pos_k // block] & causal
        logits = (q[:, h].float() @ kk[:, h].T) / math.sqrt(d)
        logits = logits.masked_fill(~allowed, float("-inf"))
        out[:, h] = torch.softmax(logits, -1) @ vv[:, h]
        lse[:, h] = torch.logsumexp(logits, -1)
    return (out.to(q.dtype), lse) if return_lse else out.to(q.dtype)


def merge_partials(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor):
    """(out, lse) of attention over the union of two disjoint key sets from each set's (out, lse): out
    [..., H, d], lse [..., H] (natural log, as attend and crisp_prefill_attention return them)."""
    lse = torch.logaddexp(lse_a, lse_b)
    out = torch.exp(lse_a - lse)[..., None] * out_a.float() + torch.exp(lse_b - lse)[..., None] * out_b.float()
    return out.to(out_a.dtype), lse


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, return_lse: bool = False):
    """Causal dense attention of one sequence (q [q_len, H, d]: its last rows; k, v [kv_len, H_kv, d], GQA by
    repetition), fp32 math; with return_lse also the log-sum-exp [q_len, H]."""
    n, heads = k.shape[0], q.shape[1]
    return attend(q, k, v, causal_block_mask(n, heads, n), n, return_lse=return_lse)


def density(masks: torch.Tensor, first: int = 0) -> torch.Tensor:
    """Fraction of causal blocks computed, per head, over query blocks first… (those a chunk touches)."""
    nb = masks.shape[-1]
    return masks[:, first:].sum((-1, -2)).float() / ((nb * (nb + 1) - first * (first + 1)) / 2)


def crisp_sequence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: CrispConfig, return_lse: bool = False):
    """Whole pipeline on one sequence (q: its last q_len ≤ kv_len rows): (out, route[H], c_struct[H],
    density[H]), plus lse [q_len, H] with return_lse."""
    n, heads = k.shape[0], q.shape[1]
    if n < max(cfg.dense_below, 1):
        masks = causal_block_mask(n, heads, cfg.block_size)
        route = torch.full((heads,), ROUTE_DENSE)
        c_struct = torch.ones(heads)
    else:
        sel, masks = plan(q, k, cfg)
        route, c_struct = sel.route, sel.c_struct
    attended = attend(q, k, v, masks, cfg.block_size, return_lse=return_lse)
    dens = density(masks, first_block(q, k, cfg.block_size))
    return (attended[0], route, c_struct, dens, attended[1]) if return_lse else (attended, route, c_struct, dens)
