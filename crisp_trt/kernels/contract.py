"""The launch contract of the pipeline, declared once for the torch launcher and the TensorRT plugin.

Both sides need the same facts: the plugin's fields and their ranges, the sizes of one launch, the workspace
layout, the launch order with grids, and every kernel argument by name. They are written here as expressions
in a small syntax both languages read — integers and floats, + - * /, &, comparisons, `and` / `or` / `not`,
`x if c else y`, `in (...)` and the functions cdiv, fdiv, min, max, pow2, sqrt, isfinite — over the names
of a launch (the config's fields, DERIVED, SIZES, the dims S / H / HK / D / total / total_k, CONSTANTS). Python evaluates
them (`evaluate`; launch.Sizes and launch.buffers are built from them); `aot.render_contract` translates them
into plugin/crispPrefillAttentionContract.h, which the plugin's C++ includes instead of a hand copy.
tests/test_launch.py fails when that header is stale or when a table drifts from CrispConfig or from the
launches the torch op really makes.
"""
from __future__ import annotations

import ast
import functools
import math

from ..config import KAPPA_HALVINGS, ROWS, CrispConfig

# Constants both sides use (launch.py re-exports the ones it needs).
CONSTANTS = {
    "KAPPA_HALVINGS": KAPPA_HALVINGS,  # route's kappa ladder: kappa, kappa/2, ... (CrispConfig.kappas)
    "ALIGN": 256,              # bytes: every workspace buffer starts on this boundary
    "TENSOR_ALIGN": 16,        # bytes: the cubins assume 16-byte aligned pointers (Triton's JIT specialisation)
    "QG": 16,                  # query blocks per select program (tl.dot needs 16 rows)
    "KC": 64,                  # key blocks per select tile and per chunk of rows' shares
    "QR": 2,                   # query blocks per select program in rows mode (no tl.dot there: more, shorter programs)
    "KR": 256,                 # key blocks per select tile in rows mode
    "RM": 128,                 # sampled rows per rows tile (RM / rows query blocks): one tensor-core tile
    "RS": 528,                 # rows programs at most (persistent, one [nb, RM] f32 slot each): 4 per H100 / H200 SM
    "RB": 16,                  # offset blocks per slash_reduce program
    "SUBTILE": 64,             # widest [L, W] sub-tile of estimate_mass
    "ELEMS": 4096,             # elements per poison program
    "ROUTE_CHUNK_MAX": 1024,   # widest route chunk
    "TMA_BLOCK": 128,          # attend loads K / V through TMA descriptors at this block size and head dim, on sm_90+
    "TMA_D": 64,
    "DESCRIPTORS": 256,        # bytes per attend program for its two device-side TMA descriptors (Triton's global scratch)
}

# The plugin's fields, in order: CrispConfig's, the head counts, then the OPTIONAL ones (name, type: INT32 / FLOAT32
# / CHAR). A field set without the optional fields (the 18 of the first plugin) means their defaults, and a plugin
# serialises an optional field only when it differs from its default, so such a set round-trips byte for byte.
# CrispConfig fields added after the first plugin are optional ones whose default (absent) is the value that
# computes what the first plugin computed (off), whatever CrispConfig's default: a field set or engine from before
# the field existed keeps its meaning.
OPTIONAL = {
    "chunked": 0,  # 1: a fifth input cu_seqlens_k (k, v hold the sequences' keys; q their last q_len positions)
    "return_lse": 0,  # 1: a second output, the LSE [tokens, num_heads] f32
    "spike": 0.0,  # CrispConfig.spike: select's per-row far-block detector (absent: off)
    "rows": 0,  # CrispConfig.rows: block-sparse rows ranked by sampled rows' attention (absent: pooled)
}


def _kind(value) -> str:
    return "CHAR" if isinstance(value, str) else "FLOAT32" if isinstance(value, float) else "INT32"


FIELDS = tuple((f, _kind(v)) for f, v in CrispConfig().to_dict().items() if f not in OPTIONAL) + (
    ("num_heads", "INT32"), ("num_kv_heads", "INT32"), ("head_dim", "INT32")) + tuple(
    (f, _kind(v)) for f, v in OPTIONAL.items())
REQUIRED_FIELDS = len(FIELDS) - len(OPTIONAL)
assert all(isinstance(v, (int, float)) for v in OPTIONAL.values())  # 4-byte values: the plugin compares them so

# Range checks in order: (field, predicate, what is expected). The first that fails names its field. They
# restate CrispConfig.__post_init__ (tests/test_launch.py probes both at every boundary).
CHECKS = (
    ("block_size", "block_size in (64, 128)", "64 or 128"),
    ("last_q", "last_q == 0 or (16 <= last_q <= block_size and (last_q & (last_q - 1)) == 0)",
     "0 (= block_size) or a power of two in [16, block_size]"),
    ("sink_tokens", "0 <= sink_tokens <= 65536", "an int in [0, 65536]"),
    ("local_blocks", "1 <= local_blocks <= 64", "an int in [1, 64]"),
    ("kappa", "isfinite(kappa) and kappa >= 0", "a finite number >= 0"),
    ("coverage", "isfinite(coverage) and 0 <= coverage <= 1", "a number in [0, 1]"),
    ("floor_quantile", "isfinite(floor_quantile) and 0 <= floor_quantile <= 1", "a number in [0, 1]"),
    ("tau", "isfinite(tau) and tau >= 0", "a finite number >= 0"),
    ("min_budget", "min_budget >= 0", "an int >= 0"),
    ("max_budget", "max_budget >= block_size", "an int >= block_size"),
    ("min_budget", "min_budget <= max_budget", "<= max_budget"),
    ("dense_below", "dense_below >= 0", "an int >= 0"),
    ("routing", "routing in ('struct', 'jsd')", '"struct" or "jsd"'),
    ("budget", "budget in ('floor', 'cumulative')", '"floor" or "cumulative"'),
    ("gamma", "isfinite(gamma) and 0 < gamma <= 1", "a number in (0, 1]"),
    ("floor_samples", "floor_samples in (16, 32, 64, 128)", "16, 32, 64 or 128"),
    ("spike", "isfinite(spike) and 0 <= spike < 1", "a number in [0, 1) (0: off)"),
    ("rows", f"rows in {ROWS}", "0 (pooled) or 16, 32 or 64 rows"),
    ("num_heads", "1 <= num_heads <= 1024", "an int in [1, 1024]"),
    ("num_kv_heads", "1 <= num_kv_heads <= num_heads and num_heads % num_kv_heads == 0",
     "an int in [1, num_heads] that divides num_heads"),
    ("head_dim", "head_dim in (64, 128, 256)", "64, 128 or 256"),
    ("chunked", "chunked in (0, 1)", "0 or 1"),
    ("return_lse", "return_lse in (0, 1)", "0 or 1"),
)

# Block quantities of a config (CrispConfig's properties: window, sink_blocks, ...; tested equal).
DERIVED = {
    "window": "last_q if last_q != 0 else block_size",
    "sink_blocks": "cdiv(sink_tokens, block_size)",
    "min_blocks": "cdiv(min_budget, block_size)",
    "max_blocks": "fdiv(max_budget, block_size)",
    "kappa_steps": "1 if coverage == 0 or budget != 'floor' else KAPPA_HALVINGS + 1",  # len(cfg.kappas())
    "estimated": "tau <= 1",  # CrispConfig.estimated: the vertical-slash estimate runs (and routes)
    # pool's blocks are read (pooled select, spike, route_jsd):
    "pooled": "rows == 0 or spike > 0 or (routing == 'jsd' and estimated)",
}

# Strides and capacities of one launch for sequences of at most max_seqlen tokens (launch.Sizes).
SIZES = {
    "nb": "cdiv(max_seqlen, block_size)",
    "chunk": "max(4, cdiv(nb, 64))",  # key blocks per estimate chunk: <= 64 chunks, each estimate_mass merges all
    "nch": "cdiv(nb, chunk)",  # estimate chunks
    "nch_cap": "min(64, cdiv(nb, 4))",  # part_m / part_l rows: a bound on nch that grows with nb
    "maxc": "max(1, min(nb, sink_blocks + max_blocks))",  # column list capacity
    "maxd": "max(1, min(nb, 2 * (local_blocks + max_blocks)))",  # distance list capacity
    "maxk": "max(1, min(nb, max(sink_blocks + max_blocks + 2 * (max_blocks + local_blocks), "
            "sink_blocks + local_blocks + max_blocks) + (max_blocks if spike > 0 else 0)))",
    # attend's key-block list (CrispConfig.max_list)
    "route_chunk": "min(ROUTE_CHUNK_MAX, pow2(nb))",  # route's chunk C, a variant axis of its cubins
}

# The workspace: (name, shape, dtype, zeroed before each launch), in layout order, the zeroed ones first
# (one memset). S sequences, H / HK heads, head dim D.
BUFFERS = (
    ("s_mass", ("S", "H", "nb * block_size"), "float32", True),
    ("columns", ("S", "H", "nb"), "int8", True),
    ("offsets", ("S", "H", "nb"), "int8", True),
    ("distances", ("S", "H", "nb"), "int8", True),
    ("counts", ("S", "H", "nb"), "int32", True),
    ("poison", ("1",), "int32", True),
    ("part_m", ("S", "H", "nch_cap", "window"), "float32", False),
    ("part_l", ("S", "H", "nch_cap", "window"), "float32", False),
    ("vsum", ("S", "H", "nb"), "float32", False),
    ("vmax", ("S", "H", "nb"), "float32", False),
    ("ssum", ("S", "H", "nb"), "float32", False),
    ("smax", ("S", "H", "nb"), "float32", False),
    ("pooled_q", ("S", "nb", "H", "D"), "float32", False),
    ("pooled_k", ("S", "nb", "HK", "D"), "float32", False),
    ("pooled_k_in", ("S", "nb", "HK", "D"), "input", False),  # pooled_k in q's dtype: spike's dot operands
    ("cols", ("S", "H", "maxc"), "int32", False),
    ("dists", ("S", "H", "maxd"), "int32", False),
    ("ncols", ("S", "H"), "int32", False),
    ("ndists", ("S", "H"), "int32", False),
    ("route", ("S", "H"), "int32", False),
    ("c_struct", ("S", "H"), "float32", False),
    ("dense", ("S",), "int32", False),
    ("scratch", ("S", "H", "nb", "nb"), "float32", False),  # select's block-sparse rows: dominates
    ("spikes", ("S", "H", "nb if spike > 0 else 1", "nb if spike > 0 else 1"), "int8", False),  # spike → select
    ("slots", ("min(RS, cdiv(nb * rows, RM) * H * S) if rows > 0 else 1", "nb if rows > 0 else 1", "RM"), "float32",
     False),  # rows' per-block LSEs: one [nb, RM] slot per rows program
    ("idx", ("S", "H", "nb", "maxk"), "int32", False),
    ("descriptors", ("S", "H", "nb", "DESCRIPTORS if block_size == TMA_BLOCK and D == TMA_D else 0"), "int8", False),
)
ITEMSIZE = {"float32": 4, "int32": 4, "int8": 1, "input": 4}  # input: q's dtype (fp16 / bf16; f32 under the interpreter)

# Launch order: (stage, grid, condition). The stage is the kernel's name less `_kernel`.
LAUNCHES = (
    ("estimate_partial", ("nch", "H", "S"), "estimated"),
    ("estimate_mass", ("nch", "H", "S"), "estimated"),
    ("slash_reduce", ("cdiv(nb, RB)", "H", "S"), "estimated"),
    ("pool", ("nb", "H + HK", "S"), "pooled"),
    ("route", ("H", "S", "1"), "True"),
    ("route_jsd", ("H", "S", "1"), "routing == 'jsd' and estimated"),
    ("spike", ("nb", "H", "S"), "spike > 0"),
    ("rows", ("min(RS, cdiv(nb * rows, RM) * H * S)", "1", "1"), "rows > 0"),  # persistent over the tiles
    ("select", ("cdiv(nb, QR) if rows > 0 else cdiv(nb, QG)", "H", "S"), "True"),
    ("attend", ("H", "nb", "S"), "True"),
    ("poison_scan", ("cdiv(max(total * H * D, 1), ELEMS) + 2 * cdiv(max(total_k * HK * D, 1), ELEMS)", "1", "1"),
     "True"),
    ("poison_apply", ("cdiv(max(total * H * D, 1), ELEMS)", "1", "1"), "True"),
)

# Kernel pointer parameters: the op's inputs and output, or a workspace buffer.
# cu_k_ptr: cu_seqlens_k of a chunked plugin, else cu_seqlens again; lse_ptr: the LSE output, or NULL (write_lse = 0).
INPUT_POINTERS = {"q_ptr": "q", "k_ptr": "k", "v_ptr": "v", "o_ptr": "out", "cu_ptr": "cu_seqlens",
                  "cu_k_ptr": "cu_seqlens_k", "lse_ptr": "lse"}
BUFFER_POINTERS = {
    "part_m_ptr": "part_m", "part_l_ptr": "part_l", "vsum_ptr": "vsum", "vmax_ptr": "vmax", "ssum_ptr": "ssum",
    "smax_ptr": "smax", "s_ptr": "s_mass", "pq_ptr": "pooled_q", "pk_ptr": "pooled_k", "pk_in_ptr": "pooled_k_in",
    "keep_c_ptr": "columns", "keep_o_ptr": "offsets", "keep_d_ptr": "distances", "cols_ptr": "cols", "ncols_ptr": "ncols",
    "dists_ptr": "dists", "ndists_ptr": "ndists", "cstruct_ptr": "c_struct", "route_ptr": "route",
    "dense_ptr": "dense", "scratch_ptr": "scratch", "spk_ptr": "spikes", "slots_ptr": "slots", "idx_ptr": "idx",
    "counts_ptr": "counts", "cnt_ptr": "counts", "flag_ptr": "poison"}
# Triton 3.6's trailing pointer parameters: a workspace buffer (global_scratch: attend's TMA descriptors) or NULL
HIDDEN_POINTERS = {"global_scratch": "descriptors", "profile_scratch": None}
# Kernel scalar parameters (f32 or i32) and the variant constexprs a cubin is picked by, by name.
FLOAT_ARGS = {"sm_scale": "1.0 / sqrt(D)", "kappa": "kappa", "quantile": "floor_quantile", "gamma": "gamma",
              "tau": "tau", "coverage": "coverage", "spike": "spike"}
INT_ARGS = {
    "steps": "kappa_steps", "total": "total", "total_k": "total_k", "write_lse": "return_lse", "seqs": "S", "chunk": "chunk", "dense_below": "max(dense_below, 1)",
    "min_blocks": "min_blocks", "max_blocks": "max_blocks", "H": "H", "G": "fdiv(H, HK)", "HK": "HK", "NB": "nb",
    "NQB": "nb", "NCH": "nch", "MAXK": "maxk", "MAXC": "maxc", "MAXD": "maxd", "SINK": "sink_blocks",
    "LOCAL": "local_blocks", "SAMPLES": "floor_samples", "q_width": "H * D", "kv_width": "HK * D",
    "width": "H * D", "BLOCK": "block_size",
    # variant constexprs (BLOCK above too)
    "D": "D", "L": "window", "C": "route_chunk", "FLOOR": "budget == 'floor'", "MIN_TOP": "min_blocks > 0",
    "R": "rows", "ROWS": "rows > 0"}


def pow2(x: int) -> int:
    """The next power of two >= x, at least 16."""
    return max(16, 1 << (max(x, 1) - 1).bit_length())


FUNCTIONS = {"cdiv": lambda a, b: -(-a // b), "fdiv": lambda a, b: a // b, "min": min, "max": max, "pow2": pow2,
             "sqrt": math.sqrt, "isfinite": math.isfinite}


@functools.cache
def _code(expr: str):
    return compile(ast.parse(expr, mode="eval"), f"<contract: {expr}>", "eval")


def evaluate(expr: str, names: dict):
    """The value of one contract expression given the launch's names (constants and functions added)."""
    return evaluator(names)(expr)


def evaluator(names: dict):
    """expr → its value over the launch's names, the scope built once for many expressions."""
    scope = {**CONSTANTS, **FUNCTIONS, **names}
    return lambda expr: eval(_code(expr), {"__builtins__": {}}, scope)  # noqa: S307 (our tables)


def names_of(cfg: CrispConfig, **more) -> dict:
    """A config's fields, the OPTIONAL fields' defaults and DERIVED quantities, plus `more` (dims, max_seqlen,
    return_lse, ...)."""
    names = {**OPTIONAL, **cfg.to_dict(), **more}
    for name, expr in DERIVED.items():
        names[name] = evaluate(expr, names)
    return names


def sizes(cfg: CrispConfig, max_seqlen: int) -> dict:
    """SIZES evaluated for sequences of at most max_seqlen tokens."""
    names = names_of(cfg, max_seqlen=max_seqlen)
    out = {}
    for name, expr in SIZES.items():
        out[name] = names[name] = evaluate(expr, names)
    return out


def dims(seqs: int, heads: int, kv_heads: int, d: int, total: int = 0, total_k: int | None = None) -> dict:
    """The dims of a launch (total_k: the keys' tokens, default total) and the head-count fields."""
    return {"S": seqs, "H": heads, "HK": kv_heads, "D": d, "total": total,
            "total_k": total if total_k is None else total_k, "num_heads": heads, "num_kv_heads": kv_heads,
            "head_dim": d}


def check(values: dict) -> str:
    """The first failing CHECKS entry as `field: expected ...`, or "" (values: the fields by name; OPTIONAL ones
    default)."""
    values = {**OPTIONAL, **values}
    for field, predicate, expected in CHECKS:
        if not evaluate(predicate, values):
            return f"{field}: expected {expected}"
    return ""
