"""A kernel module compiled from a temporary copy of its source with textual substitutions (the probes'
variants): each substitution must match, so an edit of the kernel fails the probe instead of silently timing the
original."""
from __future__ import annotations

import importlib.util
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[2] / "crisp_trt/kernels"
IMPORTS = [("from .bounds import", "from crisp_trt.kernels.bounds import"),
           ("from .launch import", "from crisp_trt.kernels.launch import")]


def variant_module(kernel: str, name: str, subs, tmp: Path):
    """crisp_trt/kernels/<kernel>.py with `subs` [(old, new), ...] applied, imported from tmp."""
    text = (KERNELS / f"{kernel}.py").read_text()
    for old, new in IMPORTS + subs:
        if old not in text:
            raise SystemExit(f"variant {name}: {old!r} not in {kernel}.py (the kernel changed: update the probe)")
        text = text.replace(old, new)
    path = tmp / f"{kernel}_{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"{kernel}_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
