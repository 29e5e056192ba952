"""Ahead-of-time compilation of crisp_trt/kernels/ for the TensorRT plugin: what to compile, and how.

The plugin launches the very `@triton.jit` functions the torch op launches (crisp_trt/kernels/pipeline.py),
compiled into cubins by `triton.compile(ASTSource(...), target=GPUTarget("cuda", arch, 32))` (no GPU needed).
A kernel's parameters split three ways, read from the kernel itself:

- runtime parameters: pointers (`*_ptr`), floats (`FLOATS`) and i32 integers (everything else: head counts,
  strides, bounds), passed by the plugin at launch, by name. The kernels never value-specialise integers
  (launch.kernel), so a cubin compiled here with plain i32 parameters is the one the torch op JIT-compiles;
- fixed constexprs: `launch.fixed` (QG, RB, W, KC, ELEMS, INTERPRET = 0), the same in both;
- variant constexprs: one cubin per value, and the plugin picks the cubin whose values match its launch:
  dtype (fp16/bf16, for kernels with q/k/v/out pointers), BLOCK (64/128), D (`--head-dims`), L (the window,
  16 ... BLOCK), route's chunk C (16 ... 1024, from NB = ceil(tokens / BLOCK): launch.route_chunk), and the
  budget flags FLOOR / MIN_TOP.

Pointer parameters are compiled with 16-byte divisibility, as Triton's JIT specialises them for torch's
allocations; the plugin checks that alignment at enqueue. num_warps / num_stages: launch.options.
"""
from __future__ import annotations

import dataclasses
import itertools
import re

import triton
from triton.backends.compiler import GPUTarget

from crisp_trt.kernels import attend, estimate, launch, poison, pool, route, select

KERNELS = {launch.name(fn): fn for fn in (
    estimate.estimate_partial_kernel, estimate.estimate_mass_kernel, estimate.slash_reduce_kernel,
    pool.pool_kernel, route.route_kernel, route.route_jsd_kernel, select.select_kernel, attend.attend_kernel,
    poison.poison_scan_kernel, poison.poison_apply_kernel)}
DTYPES = ("fp16", "bf16")
HEAD_DIMS = (64, 128, 256)
AXES = {"BLOCK": (64, 128), "L": (16, 32, 64, 128), "C": tuple(16 << i for i in range(7)), "FLOOR": (False, True),
        "MIN_TOP": (False, True)}  # flags are bools, as the torch launcher passes them
ELEMENT = {"q_ptr": "T", "k_ptr": "T", "v_ptr": "T", "o_ptr": "T",
           "keep_c_ptr": "i8", "keep_o_ptr": "i8", "keep_d_ptr": "i8",
           "cu_ptr": "i32", "idx_ptr": "i32", "cnt_ptr": "i32", "dense_ptr": "i32", "cols_ptr": "i32",
           "ncols_ptr": "i32", "dists_ptr": "i32", "ndists_ptr": "i32", "route_ptr": "i32", "counts_ptr": "i32",
           "flag_ptr": "i32"}  # every other pointer: fp32
FLOATS = ("sm_scale", "kappa", "quantile", "gamma", "tau", "coverage")
HIDDEN = ("global_scratch", "profile_scratch")  # Triton 3.6's trailing pointer parameters, passed NULL
assert launch.ROUTE_CHUNK_MAX == AXES["C"][-1]


def param_type(name: str, dtype: str) -> str:
    """Triton signature type of a runtime parameter ("*bf16", "*fp32", "fp32", "i32", ...)."""
    if name.endswith("_ptr"):
        return "*" + ELEMENT.get(name, "fp32").replace("T", dtype)
    return "fp32" if name in FLOATS else "i32"


def runtime_names(fn) -> list[str]:
    consts = set(launch.constexpr_names(fn))
    return [n for n in fn.arg_names if n not in consts]


def variant_names(fn) -> list[str]:
    """The constexprs of `fn` that are variant axes (not fixed by launch.fixed)."""
    fixed = launch.fixed(0)
    return [n for n in launch.constexpr_names(fn) if n not in fixed]


def has_dtype(fn) -> bool:
    return any(ELEMENT.get(n) == "T" for n in runtime_names(fn))


def variants(stage: str, head_dims=HEAD_DIMS):
    """The variant dicts of KERNELS[stage] ("dtype" plus its variant constexprs); L ≤ BLOCK."""
    fn = KERNELS[stage]
    names = variant_names(fn)
    domains = [head_dims if n == "D" else AXES[n] for n in names]
    for dtype in DTYPES if has_dtype(fn) else ("",):
        for values in itertools.product(*domains):
            v = dict(zip(names, values))
            if v.get("L", 0) <= v.get("BLOCK", 1 << 30):
                yield {"dtype": dtype, **v}


@dataclasses.dataclass
class Image:
    """A compiled cubin and everything the C++ launcher needs to call it."""
    stage: str
    kernel: str          # the cubin's entry name
    arch: int
    dtype: str           # "fp16" / "bf16", or "" for a kernel without q/k/v/out pointers
    constexprs: dict     # every constexpr baked into this cubin
    variant: list        # the names among them the plugin matches (the others are fixed: launch.fixed)
    params: list         # [(name, type)] in launch order, HIDDEN ones last
    num_warps: int
    shared: int
    cubin: bytes


def compile_image(stage: str, variant: dict, arch: int) -> Image:
    """Compile one variant of KERNELS[stage] for sm_<arch>; checks the launch contract it relies on."""
    fn = KERNELS[stage]
    consts = launch.constexpr_names(fn)
    values = {**launch.fixed(variant.get("BLOCK", 0)), **variant}
    missing = [n for n in consts if n not in values]
    if missing:
        raise ValueError(f"{stage}: no value for constexpr(s) {missing}")
    runtime = runtime_names(fn)
    plain = [p.name for p in fn.params if p.name in runtime and not p.do_not_specialize and not p.name.endswith("_ptr")]
    if plain:
        raise RuntimeError(f"{stage}: {plain} would be value-specialised by the JIT: decorate with launch.kernel")
    signature = {n: "constexpr" if n in consts else param_type(n, variant["dtype"] or "fp16") for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if signature[n][0] == "*"}
    source = triton.compiler.ASTSource(fn=fn, signature=signature, attrs=attrs, constexprs={n: values[n] for n in consts})
    options = launch.options(stage, variant.get("BLOCK", 0), variant.get("D", 0))
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    md = compiled.metadata
    if md.global_scratch_size or md.profile_scratch_size or md.launch_pdl or md.launch_cooperative_grid \
            or md.num_ctas != 1:
        raise RuntimeError(f"{stage} sm_{arch} {variant}: needs scratch memory, PDL, cooperative launch or "
                           "clusters, which the plugin's launcher does not provide")
    entry = re.search(rf"\.entry {md.name}\((.*?)\)", compiled.asm["ptx"], re.S)
    n_ptx = entry.group(1).count(".param") if entry else -1
    if n_ptx != len(runtime) + len(HIDDEN):
        raise RuntimeError(f"{stage}: PTX entry takes {n_ptx} parameters, expected {len(runtime)} + "
                           f"{len(HIDDEN)} hidden ({runtime})")
    params = [(n, signature[n]) for n in runtime] + [(n, "*i8") for n in HIDDEN]
    return Image(stage, md.name, arch, variant["dtype"], {n: int(values[n]) for n in consts},
                 [n for n in consts if n in variant], params, md.num_warps, md.shared, compiled.asm["cubin"])
