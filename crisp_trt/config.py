"""CrispConfig: every knob of the CRISP pipeline (docs/design.md, "Configuration"), validated on construction.

Frozen so a config can be a dict key, a torch.compile constant and a TensorRT plugin field set;
`to_dict`/`from_dict` give the exact round trip the builder and the plugin rely on.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

ROUTINGS = ("struct", "jsd")
BUDGETS = ("floor", "cumulative")
ROWS = (0, 16, 32, 64)  # CrispConfig.rows: 0 = pooled block-sparse rows
TAU_F32_ONE = 1 + 2 ** -24  # the largest tau that float32 (the kernels' and the plugin's) rounds to 1
KAPPA_HALVINGS = 3  # kappa, kappa/2, kappa/4, kappa/8 (see CrispConfig.coverage)


@dataclass(frozen=True)
class CrispConfig:
    """Knobs of estimate → route → select → attend.

    block_size     attention block B (64 or 128); selection is block-granular.
    last_q         rows of the proxy map (the last-query window L); 0 means `block_size`.
    sink_tokens    first tokens always attended (their key blocks are always kept).
    local_blocks   offset blocks next to the diagonal always kept (≥ 1; the diagonal is always computed).
    kappa          keep an entry iff it exceeds kappa × noise floor; 0 keeps every entry with mass.
    coverage       target C_struct of a head's vertical-slash selection (budget="floor"): while it falls
                   short, kappa halves, at most KAPPA_HALVINGS times — a diffuse head keeps more columns
                   and diagonals instead of losing mass; once reached, the lightest kept columns and
                   diagonals (by mass) go while C_struct stays ≥ coverage (reference.trim_to_coverage);
                   0 disables both (kappa fixed, no trim). Default 0.99, chosen with spike 0.01 by the
                   model's answers on calibration text (bench.defaults, Qwen 16k–128k: bench/NOTES.md,
                   session 17).
    floor_quantile quantile of the non-sink, non-local block means that estimates the noise floor.
    tau            routing threshold: "struct" routes vertical-slash iff C_struct ≥ tau;
                   "jsd" routes vertical-slash iff sqrt(JSD) ≥ tau. tau = 0 → every head vertical-slash;
                   tau > 1 → every head block-sparse (both scores lie in [0, 1]), and the vertical-slash
                   estimate is skipped (C_struct and JSD reported 0: `estimated`).
    min_budget     per head, at least this many tokens of columns and of diagonals (rounded up to blocks).
    max_budget     per head and per query-block row, at most this many tokens (rounded down to blocks).
    dense_below    sequences shorter than this use dense attention; 0 disables.
    routing        "struct" (C_struct off the proxy map, CRISP) or "jsd" (FlexPrefill's test).
    budget         "floor" (sink-aware noise floor, CRISP) or "cumulative" (keep until gamma of the mass).
    gamma          mass to cover for budget="cumulative".
    floor_samples  sampled entries per query-block row for the block-sparse heads' noise floor.
    spike          also attend, per query block, each earlier key block that some row of the block would give
                   more than this share of its attention, estimated against the blocks' mean keys (at most
                   max_blocks such blocks beyond the route's, lowest first; reference.spikes); 0 turns it off.
                   It catches query-dependent far references no last-window estimate sees: with coverage 0.99
                   it halves the KL to dense of the old default (0.999, no spike) on Qwen at 128k and is
                   faster below 128k (bench/NOTES.md, sessions 15 and 17).
    rows           block-sparse rows rank their key blocks by the exact attention of this many strided rows of
                   the query block (the last of every block_size / rows; reference.rows_mass) instead of the
                   pooled-q · pooled-k softmax; 0: pooled. On real Qwen attention, keeping blocks until 0.98 of the
                   16 rows' mass, they select within 2.1× of a block oracle's per-layer error at its density at 8k
                   (pooled rows: ≈ 13×) and 2.1–2.5× its KL at 32k (bench/NOTES.md, session 22). Off by default:
                   the defaults tune has not picked it (at 128k the 16k row cap costs its KL), and without the
                   spike stage it loses SmolLM2's far-needle retrievals (bench/NOTES.md, sessions 25 and 27).
    """

    block_size: int = 128
    last_q: int = 0
    sink_tokens: int = 4
    local_blocks: int = 1
    kappa: float = 8.0
    coverage: float = 0.99
    floor_quantile: float = 0.5
    tau: float = 0.5
    min_budget: int = 512
    max_budget: int = 16384
    dense_below: int = 1024
    routing: str = "struct"
    budget: str = "floor"
    gamma: float = 0.9
    floor_samples: int = 64
    spike: float = 0.01
    rows: int = 0

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, expected: str) -> None:
            if not ok:
                raise ValueError(f"CrispConfig.{name}={getattr(self, name)!r}: expected {expected}")

        def is_int(name: str) -> bool:
            value = getattr(self, name)
            return isinstance(value, int) and not isinstance(value, bool)

        def is_num(name: str) -> bool:
            value = getattr(self, name)
            return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

        for name in ("block_size", "last_q", "sink_tokens", "local_blocks", "min_budget",
                     "max_budget", "dense_below", "floor_samples", "rows"):
            if not is_int(name):
                raise TypeError(f"CrispConfig.{name}={getattr(self, name)!r}: expected an int")
        for name in ("kappa", "coverage", "floor_quantile", "tau", "gamma", "spike"):
            if not is_num(name):
                raise TypeError(f"CrispConfig.{name}={getattr(self, name)!r}: expected a finite number")
        need(self.block_size in (64, 128), "block_size", "64 or 128")
        need(self.last_q == 0 or 16 <= self.last_q <= self.block_size, "last_q",
             f"0 (= block_size) or an int in [16, block_size={self.block_size}]")
        need(self.last_q & (self.last_q - 1) == 0, "last_q", "0 or a power of two")
        need(0 <= self.sink_tokens <= 65536, "sink_tokens", "an int in [0, 65536]")
        need(1 <= self.local_blocks <= 64, "local_blocks", "an int in [1, 64]")
        need(self.kappa >= 0, "kappa", "a number >= 0")
        need(0.0 <= self.floor_quantile <= 1.0, "floor_quantile", "a number in [0, 1]")
        need(self.tau >= 0 and not 1 < self.tau <= TAU_F32_ONE, "tau",
             f"a number >= 0, <= 1 or > {TAU_F32_ONE} (the kernels compare it in float32, where it would round to 1)")
        need(self.min_budget >= 0, "min_budget", "an int >= 0")
        need(self.max_budget >= self.block_size, "max_budget", f"an int >= block_size={self.block_size}")
        need(self.min_budget <= self.max_budget, "min_budget", f"<= max_budget={self.max_budget}")
        need(self.dense_below >= 0, "dense_below", "an int >= 0")
        need(self.routing in ROUTINGS, "routing", " or ".join(map(repr, ROUTINGS)))
        need(self.budget in BUDGETS, "budget", " or ".join(map(repr, BUDGETS)))
        need(0.0 < self.gamma <= 1.0, "gamma", "a number in (0, 1]")
        need(0.0 <= self.coverage <= 1.0, "coverage", "a number in [0, 1]")
        need(self.floor_samples in (16, 32, 64, 128), "floor_samples", "16, 32, 64 or 128")
        need(0.0 <= self.spike < 1.0, "spike", "a number in [0, 1) (0: off)")
        need(self.rows in ROWS, "rows", "0 (pooled) or 16, 32 or 64 rows")  # all ≤ the smallest block_size

    # Derived, block-granular quantities shared by the reference and the kernels.
    @property
    def window(self) -> int:
        """Rows L of the proxy map."""
        return self.last_q or self.block_size

    def kappas(self) -> tuple[float, ...]:
        """The kappa ladder of the vertical-slash selection: kappa, then halvings while C_struct < coverage."""
        if self.coverage == 0 or self.budget != "floor":
            return (float(self.kappa),)
        return tuple(float(self.kappa) / 2 ** j for j in range(KAPPA_HALVINGS + 1))

    @property
    def estimated(self) -> bool:
        """Whether the vertical-slash estimate runs: not when tau > 1 makes every head block-sparse (C_struct and
        sqrt(JSD) lie in [0, 1]: neither reaches it). contract.DERIVED["estimated"] is the same rule."""
        return self.tau <= 1

    @property
    def sink_blocks(self) -> int:
        return -(-self.sink_tokens // self.block_size)

    @property
    def min_blocks(self) -> int:
        return -(-self.min_budget // self.block_size)

    @property
    def max_blocks(self) -> int:
        return self.max_budget // self.block_size

    def max_list(self, num_blocks: int) -> int:
        """Capacity of one query block's key-block list (off-diagonal blocks), for num_blocks blocks."""
        vertical_slash = self.sink_blocks + self.max_blocks + 2 * (self.max_blocks + self.local_blocks)
        block_sparse = self.sink_blocks + self.local_blocks + self.max_blocks
        spikes = self.max_blocks if self.spike > 0 else 0
        return max(1, min(num_blocks, max(vertical_slash, block_sparse) + spikes))

    def replace(self, **changes) -> "CrispConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "CrispConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"CrispConfig: unknown field(s) {unknown}; expected some of {sorted(names)}")
        return cls(**values)

    @classmethod
    def flexprefill(cls, **changes) -> "CrispConfig":
        """FlexPrefill-mode baseline: JSD routing, cumulative gamma=0.9, tau=0.1, min budget 1024, B=128, no spike
        stage (FlexPrefill has none)."""
        base = dict(routing="jsd", budget="cumulative", gamma=0.9, tau=0.1, min_budget=1024, block_size=128,
                    spike=0.0)
        base.update(changes)
        return cls(**base)


    @classmethod
    def sampled_rows(cls, gamma: float = 0.98, rows: int = 16, **changes) -> "CrispConfig":
        """The sampled-rows plan measured on Qwen (rows16_gG in bench/NOTES.md, sessions 22–25): every head
        block-sparse (tau 1.5), each query block's key blocks ranked by `rows` sampled rows' exact attention and
        kept until `gamma` of it, no minimum budget, no spike stage."""
        base = dict(tau=1.5, rows=rows, budget="cumulative", gamma=gamma, min_budget=0, spike=0.0)
        base.update(changes)
        return cls(**base)


METHODS = {
    "crisp": {},
    "flexprefill": None,  # CrispConfig.flexprefill()
    "crisp_gamma": {"budget": "cumulative"},
    "crisp_jsd": {"routing": "jsd", "tau": 0.1},
}


def method_config(method: str, base: CrispConfig | None = None) -> CrispConfig:
    """The config of a named method: crisp, flexprefill, crisp_gamma (cumulative), crisp_jsd."""
    base = base or CrispConfig()
    if method not in METHODS:
        raise ValueError(f"method={method!r}: expected one of {sorted(METHODS)}")
    if method == "flexprefill":
        return CrispConfig.flexprefill(dense_below=base.dense_below, max_budget=base.max_budget)
    return base.replace(**METHODS[method])


