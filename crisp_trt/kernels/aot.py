"""Ahead-of-time build of the TensorRT plugin's kernels and contract: what to compile, how, and the C++ it emits.

    python3 -m crisp_trt.kernels.aot --out DIR [--arch 90,100] [--head-dims 64,128,256] [--jobs N]
    python3 -m crisp_trt.kernels.aot --contract      # rewrite plugin/crispPrefillAttentionContract.h

The plugin launches the very `@triton.jit` functions the torch op launches (pipeline.py), compiled into cubins
by `triton.compile(ASTSource(...), target=GPUTarget("cuda", arch, 32))` (no GPU needed). A kernel's
parameters split three ways, read from the kernel itself:

- runtime parameters: pointers (`*_ptr`), floats (contract.FLOAT_ARGS) and i32 integers (everything else:
  head counts, strides, bounds), passed by the plugin at launch, by name. The kernels never value-specialise
  integers (launch.kernel), so a cubin compiled here with plain i32 parameters is the one the torch op
  JIT-compiles;
- fixed constexprs: `launch.fixed` (QG, KC, QR, KR, RB, W, ELEMS, INTERPRET = 0), the same in both;
- variant constexprs: one cubin per value, and the plugin picks the cubin whose values match its launch:
  dtype (fp16/bf16, for kernels with q/k/v/out pointers), BLOCK (64/128), D (`--head-dims`), L (the window,
  16 ... BLOCK), route's chunk C (16 ... 1024, from NB = ceil(tokens / BLOCK): contract.SIZES["route_chunk"]), and the
  budget flags FLOOR / MIN_TOP.

Pointer parameters are compiled with 16-byte divisibility, as Triton's JIT specialises them for torch's
allocations; the plugin checks that alignment at enqueue. num_warps / num_stages: launch.options.

`--out DIR` writes DIR/cubins/*.cubin and DIR/crispKernelImages.cpp (crispKernelImages(),
plugin/crispPrefillAttentionImages.h: per cubin its stage, entry, architecture, dtype, constexprs, parameters
in launch order with Triton's hidden scratch pointers last, num_warps, shared memory; the cubins embedded
with the assembler's .incbin), and checks that plugin/crispPrefillAttentionContract.h is what `render_contract`
generates from contract.py (the build fails on a stale contract). CMake runs it at build time. `--arch none`
emits an empty table (a plugin without kernels).
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import hashlib
import itertools
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget

from ..config import ROWS
from . import attend, contract, estimate, launch, poison, pool, route, rows, select, spike

KERNELS = {launch.name(fn): fn for fn in (
    estimate.estimate_partial_kernel, estimate.estimate_mass_kernel, estimate.slash_reduce_kernel,
    pool.pool_kernel, route.route_kernel, route.route_jsd_kernel, spike.spike_kernel, rows.rows_kernel,
    select.select_kernel,
    attend.attend_kernel,
    poison.poison_scan_kernel, poison.poison_apply_kernel)}
DTYPES = ("fp16", "bf16")
HEAD_DIMS = (64, 128, 256)
AXES = {"BLOCK": (64, 128), "L": (16, 32, 64, 128), "C": tuple(16 << i for i in range(7)), "FLOOR": (False, True),
        "MIN_TOP": (False, True), "R": tuple(r for r in ROWS if r),
        "ROWS": (False, True)}  # flags are bools, as the torch launcher passes them
_TRITON = {"float32": "fp32", "int32": "i32", "int8": "i8", "input": "T"}  # contract dtype → element; T: q's dtype
_BUFFER_DTYPE = {name: dtype for name, _, dtype, _ in contract.BUFFERS}
ELEMENT = {"q_ptr": "T", "k_ptr": "T", "v_ptr": "T", "o_ptr": "T", "cu_ptr": "i32", "cu_k_ptr": "i32", "lse_ptr": "fp32",
           **{p: _TRITON[_BUFFER_DTYPE[b]] for p, b in contract.BUFFER_POINTERS.items()}}  # buffers: their dtypes
FLOATS = tuple(contract.FLOAT_ARGS)
HIDDEN = contract.HIDDEN_POINTERS
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
    values = {**launch.fixed(variant.get("BLOCK", 0), variant.get("D", 0), arch), **variant}
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
    scratch_ok = md.global_scratch_size == 0 or (
        values.get("TMA") and md.global_scratch_size <= contract.CONSTANTS["DESCRIPTORS"]
        and contract.CONSTANTS["ALIGN"] % md.global_scratch_align == 0)  # attend's descriptors buffer holds it
    if not scratch_ok or md.profile_scratch_size or md.launch_pdl or md.launch_cooperative_grid or md.num_ctas != 1:
        raise RuntimeError(f"{stage} sm_{arch} {variant}: needs scratch memory beyond the descriptors buffer "
                           f"({md.global_scratch_size} B), PDL, cooperative launch or clusters, which the plugin's "
                           "launcher does not provide")
    entry = re.search(rf"\.entry {md.name}\((.*?)\)", compiled.asm["ptx"], re.S)
    n_ptx = entry.group(1).count(".param") if entry else -1
    if n_ptx != len(runtime) + len(HIDDEN):
        raise RuntimeError(f"{stage}: PTX entry takes {n_ptx} parameters, expected {len(runtime)} + "
                           f"{len(HIDDEN)} hidden ({runtime})")
    params = [(n, signature[n]) for n in runtime] + [(n, "*i8") for n in HIDDEN]
    return Image(stage, md.name, arch, variant["dtype"], {n: int(values[n]) for n in consts},
                 [n for n in consts if n in variant], params, md.num_warps, md.shared, compiled.asm["cubin"])


# --- the kernel table (crispKernelImages.cpp) -----------------------------------------------------------------

PARAM_TYPES = {"i32": "kINT32", "fp32": "kFLOAT32"}  # and pointers ("*...") kPOINTER
IMAGE_DTYPES = {"": "kANY", "fp16": "kFP16", "bf16": "kBF16"}
ROOT = Path(__file__).resolve().parents[2]
CONTRACT_HEADER = ROOT / "plugin" / "crispPrefillAttentionContract.h"


def _compile(job):
    return compile_image(*job)


def jobs(archs: list[int], head_dims: tuple[int, ...]):
    """(stage, variant, arch) for every cubin to build."""
    return [(stage, variant, arch) for arch in archs for stage in KERNELS for variant in variants(stage, head_dims)]


def _c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render(images, cubin_paths: list[Path]) -> str:
    """The C++ source of crispKernelImages() for `images` (cubin i read from cubin_paths[i])."""
    lines = ["// Generated by crisp_trt/kernels/aot.py: do not edit.", '#include "crispPrefillAttentionImages.h"', "",
             "namespace crisp", "{", "namespace", "{"]
    for i, (image, path) in enumerate(zip(images, cubin_paths)):
        sym = f"crisp_cubin_{i}"
        digest = hashlib.sha256(image.cubin).hexdigest()[:16]
        lines += [f"// {image.stage} sm_{image.arch} {image.dtype} {image.constexprs} sha256 {digest}",
                  f'asm(".section .rodata\\n.balign 64\\n.global {sym}\\n.hidden {sym}\\n{sym}:\\n'
                  f'.incbin \\"{path}\\"\\n.previous\\n");',
                  f'extern "C" unsigned char const {sym}[];',
                  f"CrispConstexpr const kCONSTEXPRS_{i}[] = {{"
                  + ", ".join(f"{{{_c_string(k)}, {v}, {'true' if k in image.variant else 'false'}}}"
                              for k, v in image.constexprs.items()) + "};",
                  f"CrispKernelParam const kPARAMS_{i}[] = {{"
                  + ", ".join(f"{{{_c_string(n)}, CrispParamType::{'kPOINTER' if t[0] == '*' else PARAM_TYPES[t]}}}"
                              for n, t in image.params) + "};"]
    lines += ["} // namespace", "", "CrispKernelImage const* crispKernelImages(int32_t& count) noexcept", "{"]
    if not images:
        lines += ["    count = 0;", "    return nullptr;", "}", "", "} // namespace crisp", ""]
        return "\n".join(lines)
    lines.append("    static CrispKernelImage const kIMAGES[] = {")
    for i, image in enumerate(images):
        lines.append(f"        {{{_c_string(image.stage)}, {_c_string(image.kernel)}, {image.arch}, "
                     f"CrispDtype::{IMAGE_DTYPES[image.dtype]}, kCONSTEXPRS_{i}, {len(image.constexprs)}, "
                     f"kPARAMS_{i}, {len(image.params)}, {image.num_warps}, {image.shared}, crisp_cubin_{i}, "
                     f"{len(image.cubin)}}},")
    lines += ["    };", f"    count = {len(images)};", "    return kIMAGES;", "}", "", "} // namespace crisp", ""]
    return "\n".join(lines)


# --- the contract (crispPrefillAttentionContract.h) -----------------------------------------------------------

_CALLS = {"cdiv": "crispCdiv", "fdiv": "crispFdiv", "min": "crispMin", "max": "crispMax", "pow2": "crispPow2"}
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Mod: "%", ast.BitAnd: "&", ast.Eq: "==",
        ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}


def camel(name: str) -> str:
    """block_size → blockSize (the C++ member of a field, derived quantity or size)."""
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _cpp(node, name) -> str:
    """One contract expression (a Python AST) as C++; `name` maps an identifier to its C++ text."""
    if isinstance(node, ast.Expression):
        return _cpp(node.body, name)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool):
            return "true" if node.value else "false"
        if isinstance(node.value, str):
            return _c_string(node.value)
        return repr(node.value)
    if isinstance(node, ast.Name):
        return name(node.id)
    if isinstance(node, ast.BinOp):
        return f"({_cpp(node.left, name)} {_OPS[type(node.op)]} {_cpp(node.right, name)})"
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
        return f"{'!' if isinstance(node.op, ast.Not) else '-'}({_cpp(node.operand, name)})"
    if isinstance(node, ast.BoolOp):
        return "(" + (" && " if isinstance(node.op, ast.And) else " || ").join(_cpp(v, name) for v in node.values) + ")"
    if isinstance(node, ast.IfExp):
        return f"({_cpp(node.test, name)} ? {_cpp(node.body, name)} : {_cpp(node.orelse, name)})"
    if isinstance(node, ast.Compare):
        terms, left = [], node.left
        for op, right in zip(node.ops, node.comparators):
            if isinstance(op, ast.In):
                terms.append("(" + " || ".join(f"{_cpp(left, name)} == {_cpp(e, name)}" for e in right.elts) + ")")
            else:
                terms.append(f"{_cpp(left, name)} {_OPS[type(op)]} {_cpp(right, name)}")
            left = right
        return "(" + " && ".join(terms) + ")"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        args = [_cpp(a, name) for a in node.args]
        if node.func.id == "sqrt":
            return f"std::sqrt(static_cast<double>({args[0]}))"
        if node.func.id == "isfinite":
            return f"std::isfinite({args[0]})"
        return f"{_CALLS[node.func.id]}({', '.join(args)})"
    raise ValueError(f"contract: {ast.dump(node)} has no C++ translation")


def cpp(expr: str, name) -> str:
    return _cpp(ast.parse(expr, mode="eval"), name)


def _namer(params: str = "p.", sizes: str = "z.", dims: bool = True):
    """Identifier → C++: constants kCRISP_*, fields params+member, derived params+member(), sizes sizes+member,
    and (dims) the locals S, H, HK, D, total, totalK, maxSeqlen."""
    fields = {f for f, _ in contract.FIELDS}

    def name(n: str) -> str:
        if n in contract.CONSTANTS:
            return f"kCRISP_{n}"
        if n in fields:
            return params + camel(n)
        if n in contract.DERIVED:
            return f"{params}{camel(n)}()"
        if n in contract.SIZES:
            return sizes + camel(n)
        if dims and n in ("S", "H", "HK", "D", "total"):
            return n
        if dims and n == "total_k":
            return "totalK"
        if n == "max_seqlen":
            return "maxSeqlen"
        raise ValueError(f"contract: unknown name {n!r}")
    return name


_CPP_TYPES = {"INT32": "int32_t", "FLOAT32": "float", "CHAR": "std::string"}


def _default(value) -> str:
    if isinstance(value, str):
        return _c_string(value)
    if isinstance(value, float):
        return f"{value!r}F"
    return str(value)


def render_contract() -> str:
    """The C++ header of contract.py's tables: CrispParams (fields, defaults, derived quantities), the field
    X-macro, the range checks, crispSizes, the workspace layout, the launch order and the launch arguments."""
    from ..config import CrispConfig
    defaults = {**CrispConfig().to_dict(), "num_heads": 0, "num_kv_heads": 0, "head_dim": 0, **contract.OPTIONAL}
    fields = {f for f, _ in contract.FIELDS}
    member = lambda n: camel(n) if n in fields else f"{camel(n)}()"  # noqa: E731 (inside CrispParams)
    inner = _namer(params="")
    L = ["// Generated by crisp_trt/kernels/aot.py from crisp_trt/kernels/contract.py: do not edit.",
         "// Regenerate: python3 -m crisp_trt.kernels.aot --contract (tests/test_launch.py fails when stale).",
         "#pragma once", "", '#include "crispPrefillAttentionImages.h"', "", "#include <array>", "#include <cmath>",
         "#include <cstddef>", "#include <cstdint>", "#include <initializer_list>", "#include <limits>",
         "#include <string>", "", "namespace crisp", "{", ""]
    L += [f"constexpr int64_t kCRISP_{n} = {v};" for n, v in contract.CONSTANTS.items()]
    L += ["", "inline int64_t crispCdiv(int64_t a, int64_t b) noexcept { return (a + b - 1) / b; }",
          "inline int64_t crispFdiv(int64_t a, int64_t b) noexcept { return a / b; }",
          "inline int64_t crispMin(int64_t a, int64_t b) noexcept { return a < b ? a : b; }",
          "inline int64_t crispMax(int64_t a, int64_t b) noexcept { return a > b ? a : b; }",
          "//! The next power of two >= x, at least 16.",
          "inline int64_t crispPow2(int64_t x) noexcept", "{", "    int64_t p = 16;", "    while (p < x)", "    {",
          "        p *= 2;", "    }", "    return p;", "}", "",
          "//! The plugin's fields (CrispConfig's, the head counts, the optional ones) with CrispConfig's defaults.",
          "struct CrispParams", "{"]
    L += [f"    {_CPP_TYPES[t]} {camel(f)}{{{_default(defaults[f])}}};" for f, t in contract.FIELDS]
    for n, expr in contract.DERIVED.items():  # a comparison or a logical expression is a bool, the rest int64_t
        kind = "bool" if isinstance(ast.parse(expr, mode="eval").body, (ast.Compare, ast.BoolOp)) else "int64_t"
        L += ["", f"    {kind} {camel(n)}() const noexcept", "    {",
              f"        return {cpp(expr, lambda x: member(x) if x in fields or x in contract.DERIVED else inner(x))};",
              "    }"]
    L += ["};", "", "//! X(name, member, type) for every field, in order (type: kINT32, kFLOAT32 or kCHAR).",
          "#define CRISP_FIELDS(X) \\"]
    L += [f"    X({f}, {camel(f)}, k{t}) \\" for f, t in contract.FIELDS]
    L += ["", "//! Fields 0 .. kCRISP_NB_REQUIRED_FIELDS - 1 are required; the rest are optional (default: CrispParams').",
          f"constexpr int32_t kCRISP_NB_REQUIRED_FIELDS = {contract.REQUIRED_FIELDS};",
          "", "//! The first range check `p` fails, as \"field: expected ...\", or an empty string.",
          "inline std::string crispCheckRanges(CrispParams const& p)", "{"]
    for field, predicate, expected in contract.CHECKS:
        L += [f"    if (!{cpp(predicate, _namer())})", "    {",
              f"        return {_c_string(f'{field}: expected {expected}')};", "    }"]
    L += ["    return {};", "}", "", "//! Strides and capacities of one launch (crisp_trt.kernels.launch.Sizes).",
          "struct CrispSizes", "{"]
    L += [f"    int64_t {camel(n)};" for n in contract.SIZES]
    L += ["};", "", "inline CrispSizes crispSizes(CrispParams const& p, int64_t maxSeqlen) noexcept", "{",
          "    CrispSizes z{};"]
    L += [f"    z.{camel(n)} = {cpp(e, _namer())};" for n, e in contract.SIZES.items()]
    L += ["    return z;", "}", "", "//! The workspace buffers, in layout order; the first kCRISP_ZEROED_BUFFERS are "
          "zeroed at every enqueue.", "enum CrispBuffer : int32_t", "{"]
    L += [f"    kCRISP_BUFFER_{n.upper()}," for n, _, _, _ in contract.BUFFERS]
    L += ["    kCRISP_NB_BUFFERS", "};",
          f"constexpr int32_t kCRISP_ZEROED_BUFFERS = {sum(z for *_, z in contract.BUFFERS)};", "",
          "//! Byte offsets of the buffers (each kCRISP_ALIGN-aligned), the zeroed prefix and the whole size; a "
          "size that", "//! would not fit in size_t saturates at SIZE_MAX.", "struct CrispWorkspaceLayout", "{",
          "    size_t offset[kCRISP_NB_BUFFERS];", "    size_t zeroedBytes;", "    size_t total;", "};", "",
          "//! bytes * every factor (all >= 0), rounded up to kCRISP_ALIGN, saturating at SIZE_MAX.",
          "inline size_t crispBufferBytes(std::initializer_list<int64_t> factors, size_t bytes) noexcept", "{",
          "    size_t constexpr kMAX = std::numeric_limits<size_t>::max();", "    for (int64_t f : factors)", "    {",
          "        auto const u = static_cast<size_t>(f);", "        if (u != 0 && bytes > kMAX / u)", "        {",
          "            return kMAX;", "        }", "        bytes *= u;", "    }",
          "    size_t constexpr kA = static_cast<size_t>(kCRISP_ALIGN);",
          "    return bytes > kMAX - kA ? kMAX : (bytes + kA - 1) / kA * kA;", "}", "",
          "inline size_t crispAddBytes(size_t a, size_t b) noexcept", "{",
          "    return a > std::numeric_limits<size_t>::max() - b ? std::numeric_limits<size_t>::max() : a + b;", "}",
          "",
          "//! The layout for `seqs` sequences (at least 1) of at most `maxSeqlen` tokens; grows with both.",
          "inline CrispWorkspaceLayout crispWorkspaceLayout(CrispParams const& p, int64_t seqs, int64_t maxSeqlen) "
          "noexcept", "{", "    CrispSizes const z = crispSizes(p, maxSeqlen);",
          "    int64_t const S = seqs < 1 ? 1 : seqs;", "    int64_t const H = p.numHeads;",
          "    int64_t const HK = p.numKvHeads;", "    int64_t const D = p.headDim;", "    CrispWorkspaceLayout w{};",
          "    size_t at = 0;"]
    for n, shape, dtype, zeroed in contract.BUFFERS:
        factors = ", ".join(cpp(e, _namer()) for e in shape)
        L += [f"    w.offset[kCRISP_BUFFER_{n.upper()}] = at;",
              f"    at = crispAddBytes(at, crispBufferBytes({{{factors}}}, {contract.ITEMSIZE[dtype]}));"]
        if zeroed:
            L.append("    w.zeroedBytes = at;")
    L += ["    w.total = at;", "    (void) HK;", "    (void) D;", "    return w;", "}", "",
          "//! One launch of the pipeline: its stage (kernel name less _kernel), grid, and whether it runs.",
          "struct CrispLaunch", "{", "    char const* stage;", "    int64_t grid[3];", "    bool enabled;", "};",
          f"constexpr int32_t kCRISP_NB_LAUNCHES = {len(contract.LAUNCHES)};", "",
          "//! The launches in order (crisp_trt/kernels/pipeline.py's), for S sequences of `total` packed query tokens",
          "//! and `totalK` packed key tokens.",
          "inline std::array<CrispLaunch, kCRISP_NB_LAUNCHES> crispLaunchOrder(CrispParams const& p, "
          "CrispSizes const& z, int64_t S, int64_t total, int64_t totalK) noexcept", "{",
          "    int64_t const H = p.numHeads;", "    int64_t const HK = p.numKvHeads;", "    int64_t const D = p.headDim;",
          "    (void) total;", "    (void) totalK;", "    (void) HK;", "    (void) D;", "    return {{"]
    for stage, grid, cond in contract.LAUNCHES:
        L.append(f"        {{{_c_string(stage)}, {{{', '.join(cpp(g, _namer()) for g in grid)}}}, "
                 f"{cpp(cond, _namer())}}},")
    args = list(contract.INPUT_POINTERS.items()) + list(contract.BUFFER_POINTERS.items())
    L += ["    }};", "}", "", "//! A kernel argument by parameter name (a cubin's variant constexprs are matched by "
          "name too).", "struct CrispArg", "{", "    char const* name;", "    CrispParamType type;",
          "    void const* pointer;", "    int64_t integer;", "    float real;", "};",
          "", "//! The op's tensors of one enqueue (cuSeqlensK = cuSeqlens for whole prompts; lse may be null).",
          "struct CrispTensors", "{", "    void const* q;", "    void const* k;", "    void const* v;", "    void* out;",
          "    void const* cuSeqlens;", "    void const* cuSeqlensK;", "    void* lse;", "};",
          f"constexpr int32_t kCRISP_NB_ARGS = {len(args) + len(contract.HIDDEN_POINTERS) + len(contract.FLOAT_ARGS) + len(contract.INT_ARGS)};",
          "", "//! Every kernel argument of one enqueue, by name: the tensors, the workspace buffers, Triton's hidden",
          "//! pointers (a workspace buffer or null), the scalars and the variant constexprs (contract.py's tables).",
          "inline std::array<CrispArg, kCRISP_NB_ARGS> crispLaunchArgs(CrispParams const& p, CrispSizes const& z, "
          "CrispWorkspaceLayout const& w,", "    char* workspace, CrispTensors const& t, int64_t S, int64_t total, "
          "int64_t totalK) noexcept", "{", "    int64_t const H = p.numHeads;", "    int64_t const HK = p.numKvHeads;",
          "    int64_t const D = p.headDim;", "    return {{"]
    tensors = {"q": "t.q", "k": "t.k", "v": "t.v", "out": "t.out", "cu_seqlens": "t.cuSeqlens",
               "cu_seqlens_k": "t.cuSeqlensK", "lse": "t.lse"}
    for param, target in contract.INPUT_POINTERS.items():
        L.append(f"        {{{_c_string(param)}, CrispParamType::kPOINTER, {tensors[target]}, 0, 0.F}},")
    for param, buffer in contract.BUFFER_POINTERS.items():
        L.append(f"        {{{_c_string(param)}, CrispParamType::kPOINTER, workspace + "
                 f"w.offset[kCRISP_BUFFER_{buffer.upper()}], 0, 0.F}},")
    for param, buffer in contract.HIDDEN_POINTERS.items():
        target = "nullptr" if buffer is None else f"workspace + w.offset[kCRISP_BUFFER_{buffer.upper()}]"
        L.append(f"        {{{_c_string(param)}, CrispParamType::kPOINTER, {target}, 0, 0.F}},")
    for param, expr in contract.FLOAT_ARGS.items():
        L.append(f"        {{{_c_string(param)}, CrispParamType::kFLOAT32, nullptr, 0, "
                 f"static_cast<float>({cpp(expr, _namer())})}},")
    for param, expr in contract.INT_ARGS.items():
        L.append(f"        {{{_c_string(param)}, CrispParamType::kINT32, nullptr, "
                 f"static_cast<int64_t>({cpp(expr, _namer())}), 0.F}},")
    L += ["    }};", "}", "", "} // namespace crisp", ""]
    return "\n".join(L)


def _parse_archs(text: str) -> list[int]:
    if text.strip().lower() in ("", "none"):
        return []
    return [int(a.strip().rstrip("a")) for a in text.replace(";", ",").split(",") if a.strip()]


def _parse_head_dims(text: str) -> tuple[int, ...]:
    dims = tuple(int(x) for x in text.replace(";", ",").split(",") if x.strip())
    if not dims or any(d not in HEAD_DIMS for d in dims):
        raise argparse.ArgumentTypeError(f"--head-dims {text}: expected some of {HEAD_DIMS}")
    return dims


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="folder of the cubins and crispKernelImages.cpp")
    ap.add_argument("--contract", action="store_true", help=f"rewrite {CONTRACT_HEADER.relative_to(ROOT)}")
    ap.add_argument("--arch", default="90", help="compute capabilities, e.g. 90 or 80,90,100; none: no kernels")
    ap.add_argument("--head-dims", type=_parse_head_dims, default=HEAD_DIMS, help="head_dim values to embed")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    if launch.INTERPRET:  # the interpreter's kernels cannot be compiled: run again without it (tests set it)
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        os.execve(sys.executable, [sys.executable, "-m", "crisp_trt.kernels.aot", *(sys.argv[1:] if argv is None
                                                                                      else argv)], env)
    if args.contract:
        CONTRACT_HEADER.write_text(render_contract())
        print(f"aot: wrote {CONTRACT_HEADER}")
    if args.out is None:
        return 0 if args.contract else ap.error("--out or --contract")
    if not CONTRACT_HEADER.is_file() or CONTRACT_HEADER.read_text() != render_contract():
        print(f"aot: {CONTRACT_HEADER} is stale: contract.py changed; regenerate it with "
              "python3 -m crisp_trt.kernels.aot --contract", file=sys.stderr)
        return 1
    todo = jobs(_parse_archs(args.arch), args.head_dims)
    cubins = args.out / "cubins"
    cubins.mkdir(parents=True, exist_ok=True)
    if todo:
        with ProcessPoolExecutor(max(1, min(args.jobs, len(todo)))) as pool_:
            images = list(pool_.map(_compile, todo))
    else:
        images = []
    paths = []
    for i, image in enumerate(images):
        path = (cubins / f"{image.stage}_sm{image.arch}_{i}.cubin").resolve()
        path.write_bytes(image.cubin)
        paths.append(path)
    (args.out / "crispKernelImages.cpp").write_text(render(images, paths))
    print(f"aot: {len(images)} cubins for sm_{args.arch} -> {args.out}/crispKernelImages.cpp")
    return 0


if __name__ == "__main__":
    sys.exit(main())
