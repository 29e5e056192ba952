"""The variant probes' shared parts: a kernel module compiled from a temporary copy of its source with textual
substitutions (each must match, so an edit of the kernel fails the probe instead of silently timing the
original), and their command line."""
from __future__ import annotations

import argparse
import importlib.util
import re
import tempfile
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[2] / "crisp_trt/kernels"
IMPORTS = re.compile(r"^from \.(?!\.)(\w*) import", re.M)  # a sibling's relative import → absolute


def variant_module(kernel: str, name: str, subs, tmp: Path):
    """crisp_trt/kernels/<kernel>.py with `subs` [(old, new), ...] applied, imported from tmp."""
    text = IMPORTS.sub(lambda m: f"from crisp_trt.kernels{'.' + m[1] if m[1] else ''} import",
                       (KERNELS / f"{kernel}.py").read_text())
    if re.search(r"^from \.\.", text, re.M):
        raise SystemExit(f"variant {name}: {kernel}.py imports from outside crisp_trt.kernels (update the probe)")
    for old, new in subs:
        if old not in text:
            raise SystemExit(f"variant {name}: {old!r} not in {kernel}.py (the kernel changed: update the probe)")
        text = text.replace(old, new)
    path = tmp / f"{kernel}_{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"{kernel}_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def variant_modules(kernel: str, doc: str, variants: dict, shapes: str, lengths: str):
    """(args, {name: module}) from the command line: --shapes, --lengths, --variants (names of `variants`, whose
    values start with the substitutions; 'base' first), --repeats."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=shapes)
    ap.add_argument("--lengths", default=lengths)
    ap.add_argument("--variants", default=",".join(variants))
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    names = args.variants.split(",")
    unknown = [v for v in names if v not in variants]
    if unknown or names[0] != "base":
        raise SystemExit(f"--variants: {unknown or names}: expected 'base' first, then any of {', '.join(variants)}")
    tmp = Path(tempfile.mkdtemp())
    return args, {name: variant_module(kernel, name, variants[name][0], tmp) for name in names}
