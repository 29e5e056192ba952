"""Launch rules shared by the torch launcher (pipeline.py, attend.py, poison.py) and the TensorRT plugin's
ahead-of-time build (aot.py), so that the plugin runs the very cubins the torch op JIT-compiles.

- `kernel`: `triton.jit` that never specialises integer arguments on their value. Triton's JIT otherwise
  compiles an argument equal to 1 as a constant and marks multiples of 16, so the cubin would depend on the
  input; with plain i32 parameters the JIT's cubin equals the one compiled ahead of time.
  Pointer parameters end in `_ptr` (they keep Triton's 16-byte alignment specialisation).
- `Sizes` / `buffers` / `Workspace`: strides and buffers of one launch, from max_seqlen (the plugin: its
  tokens), laid out in one allocation whose zeroed prefix takes one memset (the torch op and the plugin);
  `workspace` gives Sizes and Workspace, cached per shape. All three evaluate contract.py's tables, which
  the plugin's C++ is generated from.
- `fixed` / `options`: constexprs fixed by these rules (`tma`: attend's K / V through TMA descriptors), and
  num_warps / num_stages.
- `run`: launch a kernel with both, and a workspace buffer as Triton's global scratch where the kernel needs one.
- `or_unused`: an optional f32 output (the LSE) as a pointer argument.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import math
import dataclasses
import os
from dataclasses import dataclass

import torch
import triton
from triton.runtime import _allocation  # the allocator ContextVar behind triton.set_allocator (no public getter)

from ..config import CrispConfig
from . import contract

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
QG = contract.CONSTANTS["QG"]  # query blocks per select program (tl.dot needs 16 rows)
SELECT_CHUNK = contract.CONSTANTS["KC"]  # key blocks per select tile
QR, KR = contract.CONSTANTS["QR"], contract.CONSTANTS["KR"]  # the same two in rows mode
ROWS_TILE = contract.CONSTANTS["RM"]  # sampled rows per rows tile
ROWS_PROGRAMS = contract.CONSTANTS["RS"]  # persistent rows programs at most
SLASH_ROWS = contract.CONSTANTS["RB"]  # offset blocks per slash_reduce program
SUBTILE = contract.CONSTANTS["SUBTILE"]  # widest [L, W] sub-tile of estimate_mass
POISON_ELEMS = contract.CONSTANTS["ELEMS"]  # elements per poison program
ROUTE_CHUNK_MAX = contract.CONSTANTS["ROUTE_CHUNK_MAX"]  # widest route chunk
WIDE = ("estimate_partial", "estimate_mass", "spike", "rows", "attend")  # 8 warps when BLOCK·D > 64·128


def kernel(fn):
    """triton.jit with every non-pointer, non-constexpr parameter in do_not_specialize."""
    params = inspect.signature(fn).parameters.values()
    scalars = [p.name for p in params if not p.name.endswith("_ptr") and "constexpr" not in str(p.annotation)]
    return triton.jit(fn, do_not_specialize=scalars)


def name(fn) -> str:
    """A kernel's stage name: `route_kernel` → `route` (the plugin's image names)."""
    return fn.fn.__name__.removesuffix("_kernel")


@functools.cache
def constexpr_names(fn) -> tuple[str, ...]:
    """The constexpr parameters of a kernel (cached: inspect.signature costs ~10 µs, and the op launches ~9
    kernels per call)."""
    return tuple(p.name for p in inspect.signature(fn.fn).parameters.values() if "constexpr" in str(p.annotation))


def tma(block: int, d: int, arch: int) -> bool:
    """attend loads its listed K / V blocks through device-side TMA descriptors: sm_90+ at (BLOCK, D) = (128, 64),
    where it measured 0.80 → 0.87× of cuDNN's rate at 32k–128k with the same output bit for bit (d 128 lost 1–5 %;
    probes/attend_variants_s20). The descriptors live in the workspace's `descriptors` buffer."""
    return arch >= 90 and block == contract.CONSTANTS["TMA_BLOCK"] and d == contract.CONSTANTS["TMA_D"]


@functools.cache
def _capability(device: int) -> int:
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


def arch_of(t: torch.Tensor) -> int:
    """The compute capability (90 for sm_90) a kernel launched on t's device compiles for; 0 on the CPU (the
    interpreter)."""
    return _capability(t.get_device()) if t.is_cuda and not INTERPRET else 0


def fixed(block: int, d: int = 0, arch: int = 0) -> dict:
    """Constexprs these rules fix for a launch at this block size, head dim and arch; each kernel takes those it
    declares."""
    return {"W": min(block, SUBTILE), "RB": SLASH_ROWS, "QG": QG, "KC": SELECT_CHUNK, "QR": QR, "KR": KR,
            "RM": ROWS_TILE, "ELEMS": POISON_ELEMS,
            "INTERPRET": INTERPRET, "TMA": tma(block, d, arch)}


def options(stage: str, block: int, d: int) -> dict:
    """num_warps / num_stages of a stage's kernel (Triton's defaults are 4 / 3)."""
    warps = 8 if stage in WIDE and block * d > 64 * 128 else 4
    if stage == "spike" and (block, d) == (128, 128):  # −12 to −20 % against 8 / 3 (probes/spike_variants_s20)
        return {"num_warps": 4, "num_stages": 2}
    if stage != "attend":
        return {"num_warps": warps, "num_stages": 3}
    stages = 1 if block * d > 128 * 128 else 2 if block * d > 64 * 128 else 3  # B=128, d=256: 1 stage fits
    return {"num_warps": warps, "num_stages": stages}  # d 64: 3 stages +3-5 % (probes/attend_variants.json)


_COMPILED: dict = {}  # launch key → (CompiledKernel, constexpr values in signature order)
_I32 = range(-2 ** 31, 2 ** 31)


def _arg_key(arg):
    """What Triton's JIT specialises a `kernel` argument on: a tensor's dtype and 16-byte alignment (and its
    device: a CompiledKernel is loaded per device), an int's width (no values: `kernel` specialises none),
    else the type."""
    if hasattr(arg, "data_ptr"):
        return arg.dtype, arg.data_ptr() % 16 == 0, arg.get_device()
    if type(arg) is int:
        return arg in _I32
    return type(arg)


@contextlib.contextmanager
def global_scratch(buffer: torch.Tensor | None):
    """Inside: Triton's allocator (a ContextVar: this thread's, restored on exit) hands a launch's global scratch
    out of `buffer` (bytes), refusing a larger or misaligned request; None: the allocator as it was."""
    if buffer is None:
        yield
        return

    def allocate(size: int, align: int, stream):
        if size > buffer.numel() or buffer.data_ptr() % align:
            raise RuntimeError(f"global scratch: a launch asks for {size} bytes aligned to {align}; the workspace "
                               f"buffer holds {buffer.numel()} bytes at offset {buffer.data_ptr() % align} from it")
        return buffer

    token = _allocation._allocator.set(allocate)
    try:
        yield
    finally:
        _allocation._allocator.reset(token)


def run(fn, grid, *args, block: int, d: int = 0, scratch: torch.Tensor | None = None, **constexprs):
    """fn[grid](*args, **constexprs) plus the fixed constexprs it declares and its launch options; `scratch`
    (uint8, the workspace's `descriptors`) serves as its global scratch where the cubin needs one.

    The first launch of a specialisation goes through Triton's JIT (which compiles); later ones launch its
    CompiledKernel directly, skipping the JIT's argument binding and cache lookup (~9 launches per op
    call: host time that dominates at short lengths). Under TRITON_INTERPRET=1 every launch is the JIT's."""
    if not INTERPRET:
        key = (fn, block, d, tuple(constexprs.items()), tuple(map(_arg_key, args)))
        hit = _COMPILED.get(key)
        if hit is not None:
            compiled, const_values = hit
            with global_scratch(scratch):
                compiled[tuple(grid) + (1,) * (3 - len(grid))](*args, *const_values)
            return compiled
    declared = constexpr_names(fn)
    arch = next((arch_of(a) for a in args if isinstance(a, torch.Tensor)), 0)
    consts = {k: v for k, v in fixed(block, d, arch).items() if k in declared}
    arity = len(inspect.signature(fn.fn).parameters)
    if len(args) + len(declared) != arity:
        raise TypeError(f"{name(fn)}: {len(args)} positional arguments + constexprs {declared} != its "
                        f"{arity} parameters (launch.run needs the constexprs declared last)")
    with global_scratch(scratch):
        compiled = fn[grid](*args, **constexprs, **consts, **options(name(fn), block, d))
    if not INTERPRET and compiled is not None:  # None: a stubbed launcher (tests)
        values = {**constexprs, **consts}
        _COMPILED[key] = (compiled, tuple(values[c] for c in declared))
    return compiled


def or_unused(t: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """t, or for None an empty f32 tensor on like's device: the pointer of an output the launch's flag
    (write_lse = 0) keeps the kernel from touching; the plugin passes NULL there, and both are 16-byte
    aligned, so the cubin is the same."""
    return torch.empty(0, dtype=torch.float32, device=like.device) if t is None else t


@dataclass(frozen=True)
class Sizes:
    """Strides and capacities of one launch for sequences of at most max_seqlen tokens (NB blocks)."""

    nb: int
    chunk: int  # key blocks per estimate chunk
    nch: int  # estimate chunks (≤ 64)
    nch_cap: int  # part_m / part_l rows: a bound on nch that grows with NB (nch itself does not)
    maxc: int  # column list capacity
    maxd: int  # distance list capacity
    maxk: int  # key-block list capacity (attend's idx)
    route_chunk: int

    @classmethod
    def of(cls, max_seqlen: int, cfg: CrispConfig) -> "Sizes":
        return cls(**contract.sizes(cfg, max_seqlen))


ZEROED = tuple(name for name, _, _, zeroed in contract.BUFFERS if zeroed)  # zeroed before each launch


def buffers(seqs: int, heads: int, kv_heads: int, d: int, cfg: CrispConfig, z: Sizes) -> dict:
    """name → (shape, dtype) of every buffer of one launch (contract.BUFFERS), the ZEROED ones first (the
    plugin lays its workspace out in this order, each buffer 256-byte aligned, and zeroes the prefix with one
    memset)."""
    names = {**contract.names_of(cfg, **contract.dims(seqs, heads, kv_heads, d)), **dataclasses.asdict(z)}
    return {name: (tuple(contract.evaluate(e, names) for e in shape), dtype)
            for name, shape, dtype, _ in contract.BUFFERS}


ALIGN = contract.CONSTANTS["ALIGN"]  # bytes: every buffer of the workspace starts on this boundary
ITEMSIZE = contract.ITEMSIZE


@dataclass(frozen=True)
class Workspace:
    """The byte layout of `buffers` in one allocation: name → (offset, shape, dtype), in buffers' order, each
    buffer ALIGN-aligned; `zeroed` bytes (the ZEROED buffers, first) take one memset; `size` in all."""

    layout: dict
    zeroed: int
    size: int

    @classmethod
    def of(cls, shapes: dict) -> "Workspace":
        layout, offset, zeroed = {}, 0, 0
        for name, (shape, dtype) in shapes.items():
            layout[name] = (offset, shape, dtype)
            offset += -(-math.prod(shape) * ITEMSIZE[dtype] // ALIGN) * ALIGN
            if name in ZEROED:
                zeroed = offset
        return cls(layout, zeroed, offset)


GRIDS = {stage: (grid, cond) for stage, grid, cond in contract.LAUNCHES}


def _grid(stage: str, value) -> tuple[int, ...] | None:
    grid, cond = GRIDS[stage]
    return tuple(int(value(e)) for e in grid) if value(cond) else None


@functools.lru_cache(maxsize=256)
def _grid_of(stage: str, names: tuple) -> tuple[int, ...] | None:
    return _grid(stage, contract.evaluator(dict(names)))


def grid(stage: str, **names) -> tuple[int, ...] | None:
    """contract.LAUNCHES' grid of one stage over `names` (those its grid and condition read), None where its
    condition is false; cached, so a layer's launch costs a dictionary lookup."""
    return _grid_of(stage, tuple(sorted(names.items())))


@functools.lru_cache(maxsize=64)
def _names(seqs: int, heads: int, kv_heads: int, d: int, cfg: CrispConfig, max_seqlen: int) -> dict:
    return {**contract.names_of(cfg, **contract.dims(seqs, heads, kv_heads, d)), **vars(Sizes.of(max_seqlen, cfg))}


@functools.lru_cache(maxsize=64)
def grids(seqs: int, heads: int, kv_heads: int, d: int, cfg: CrispConfig, max_seqlen: int, total: int,
          total_k: int) -> dict[str, tuple[int, ...] | None]:
    """Every stage's grid for one launch, None for a stage the config does not run (the plugin's
    crispLaunchOrder evaluates the same table); cached like workspace (a new total costs ≈ 25 µs of host time once)."""
    value = contract.evaluator({**_names(seqs, heads, kv_heads, d, cfg, max_seqlen), "total": total,
                                "total_k": total_k})
    return {stage: _grid(stage, value) for stage in GRIDS}


@functools.lru_cache(maxsize=64)
def workspace(seqs: int, heads: int, kv_heads: int, d: int, cfg: CrispConfig,
              max_seqlen: int) -> tuple[Sizes, Workspace]:
    """Sizes and workspace layout of one launch, cached: every layer of a prefill asks for the same one."""
    z = Sizes.of(max_seqlen, cfg)
    return z, Workspace.of(buffers(seqs, heads, kv_heads, d, cfg, z))
