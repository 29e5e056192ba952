"""Ahead-of-time compilation of crisp_trt/kernels/ for the TensorRT plugin: what to compile, and how.

The plugin launches the very `@triton.jit` functions the torch op launches, compiled into cubins by
`triton.compile(ASTSource(...), target=GPUTarget("cuda", arch, 32))` (no GPU needed). A kernel's
parameters split three ways, read from the kernel itself (`fn.params[i].is_constexpr`):

- runtime parameters (pointers, scalars): passed by the plugin at launch, by name;
- variant constexprs: one cubin per value — dtype (fp16/bf16), BLOCK (64/128), D (64/128/256) and, while
  the kernel declares them constexpr, the head counts H and G (one cubin per (H, G) in `--heads`);
- fixed constexprs: one value for the plugin: INTERPRET=False, MAXK=1 (the dense path: idx/counts are read
  but multiplied by 0 when dense[s] = 1, attend.py) and NQB = ceil(max_seqlen / BLOCK), which caps every
  sequence at `max_seqlen` tokens (bounds.seq_bounds) and strides the idx/counts rows.

A parameter that a kernel later turns from constexpr into a runtime one simply becomes a runtime
parameter here (type from `TYPES`), and its variant axis disappears: nothing else changes.
Pointer parameters are compiled with 16-byte divisibility, as Triton's JIT specialises them for
torch's allocations; the plugin checks that alignment at enqueue.
"""
from __future__ import annotations

import dataclasses
import itertools
import re

import triton
from triton.backends.compiler import GPUTarget

from crisp_trt.kernels import attend as attend_module

DTYPES = ("fp16", "bf16")
BLOCKS = (64, 128)
HEAD_DIMS = (64, 128, 256)
# Runtime parameter types by name ("*T": a pointer to the variant's element type). Integers that a kernel
# takes at run time are int32, as Triton types a Python int below 2**31.
TYPES = {"q_ptr": "*T", "k_ptr": "*T", "v_ptr": "*T", "o_ptr": "*T", "cu_ptr": "*i32", "idx_ptr": "*i32",
         "cnt_ptr": "*i32", "dense_ptr": "*i32", "sm_scale": "fp32",
         "total": "i32", "H": "i32", "G": "i32", "NQB": "i32", "MAXK": "i32"}
HIDDEN = ("global_scratch", "profile_scratch")  # Triton 3.6's trailing pointer parameters, passed NULL


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """One Triton kernel the plugin launches, with its plugin-wide constexprs and launch options."""
    fn: object

    def fixed(self, block: int, max_seqlen: int) -> dict:
        return {"NQB": -(-max_seqlen // block), "MAXK": 1, "INTERPRET": False}

    def options(self, variant: dict) -> dict:
        """num_warps/num_stages the torch launcher (attend.attend) picks for this variant; the test
        test_aot_options_match_the_torch_launcher checks that they agree."""
        return {"num_warps": 4 if variant["BLOCK"] * variant["D"] <= 64 * 128 else 8, "num_stages": 2}

    def constexpr_names(self) -> list[str]:
        return [p.name for p in self.fn.params if p.is_constexpr]

    def runtime_names(self) -> list[str]:
        return [p.name for p in self.fn.params if not p.is_constexpr]


KERNELS = {"attend": KernelSpec(attend_module.attend_kernel)}


@dataclasses.dataclass
class Image:
    """A compiled cubin and everything the C++ launcher needs to call it."""
    stage: str
    kernel: str          # the cubin's entry name
    arch: int
    dtype: str
    constexprs: dict     # the constexprs baked into this cubin (the plugin matches them by name)
    params: list         # [(name, type)] in launch order, HIDDEN ones last
    num_warps: int
    shared: int
    cubin: bytes


def variants(spec: KernelSpec, heads: list[tuple[int, int]], max_seqlen: int):
    """The variant dicts of `spec`: dtype x BLOCK x D, times `heads` while H/G are constexpr."""
    names = spec.constexpr_names()
    head_axis = heads if {"H", "G"} & set(names) else [None]
    for dtype, block, d, hg in itertools.product(DTYPES, BLOCKS, HEAD_DIMS, head_axis):
        variant = {"dtype": dtype, "BLOCK": block, "D": d, **spec.fixed(block, max_seqlen)}
        if hg is not None:
            variant.update(H=hg[0], G=hg[0] // hg[1])
        yield variant


def compile_image(stage: str, variant: dict, arch: int) -> Image:
    """Compile one variant of KERNELS[stage] for sm_<arch>; checks the launch contract it relies on."""
    spec = KERNELS[stage]
    consts = spec.constexpr_names()
    missing = [n for n in consts if n not in variant]
    if missing:
        raise ValueError(f"{stage}: no value for constexpr(s) {missing}")
    runtime = spec.runtime_names()
    signature = {n: "constexpr" if n in consts else TYPES[n].replace("T", variant["dtype"]) for n in
                 spec.fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(spec.fn.arg_names) if signature[n][0] == "*"}
    source = triton.compiler.ASTSource(fn=spec.fn, signature=signature, attrs=attrs,
                                       constexprs={n: variant[n] for n in consts})
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=spec.options(variant))
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
    return Image(stage, md.name, arch, variant["dtype"], {n: int(variant[n]) for n in consts},
                 params, md.num_warps, md.shared, compiled.asm["cubin"])
