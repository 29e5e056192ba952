"""Long real text for 16k–128k-token prompts: prose and source code that install from Debian's registry.

| corpus       | what (Debian package)                                                        | role        |
|--------------|------------------------------------------------------------------------------|-------------|
| `docs`       | Python 3.11 Language Reference + Tutorial, reStructuredText (`python3.11-doc`) | evaluation  |
| `code`       | CPython 3.11 standard library, top-level modules a–m (`libpython3.11-stdlib`) | evaluation  |
| `docs_calib` | Python 3.11 HOWTOs + FAQ (`python3.11-doc`)                                   | calibration |
| `code_calib` | CPython 3.11 standard library, top-level modules n–z (`libpython3.11-stdlib`) | calibration |

Evaluation and calibration corpora share no document, so defaults tuned on the `_calib` corpora are
judged on text they never saw. Each corpus is its files in sorted order, cut at MAX_CHARS (≈ 300k+
tokens). `export(dir)` writes them as `<name>.txt` for a machine without the packages (the GPU machine):
`corpus()` reads `$CRISP_TRT_TEXTS/<name>.txt` first when that variable is set.
"""
from __future__ import annotations

import glob
import os
from pathlib import Path

DOCS = "/usr/share/doc/python3.11/html/_sources"
STDLIB = "/usr/lib/python3.11"
MAX_CHARS = 1_200_000
CORPORA = {
    "docs": ("python3.11-doc", [f"{DOCS}/reference/*.rst.txt", f"{DOCS}/tutorial/*.rst.txt"]),
    "code": ("libpython3.11-stdlib", [f"{STDLIB}/[a-m]*.py"]),
    "docs_calib": ("python3.11-doc", [f"{DOCS}/howto/*.rst.txt", f"{DOCS}/faq/*.rst.txt"]),
    "code_calib": ("libpython3.11-stdlib", [f"{STDLIB}/[n-z]*.py"]),
}
EVALUATION = ("docs", "code")
CALIBRATION = ("docs_calib", "code_calib")


def corpus_files(name: str) -> list[str]:
    """The corpus's source files in order; FileNotFoundError naming the Debian package when absent."""
    if name not in CORPORA:
        raise ValueError(f"corpus={name!r}: expected one of {', '.join(CORPORA)}")
    package, patterns = CORPORA[name]
    files = [f for pattern in patterns for f in sorted(glob.glob(pattern))]
    if not files:
        raise FileNotFoundError(f"corpus {name!r} reads {', '.join(patterns)}, from Debian's {package}: "
                                f"apt-get install {package} (or set CRISP_TRT_TEXTS to a folder from "
                                "crisp_trt.workloads.texts.export)")
    return files


def corpus(name: str) -> str:
    """The corpus text (≤ MAX_CHARS characters)."""
    folder = os.environ.get("CRISP_TRT_TEXTS")
    if folder and (Path(folder) / f"{name}.txt").is_file():
        return (Path(folder) / f"{name}.txt").read_text(encoding="utf-8")
    parts, size = [], 0
    for path in corpus_files(name):
        text = Path(path).read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        size += len(text) + 2
        if size >= MAX_CHARS:
            break
    return "\n\n".join(parts)[:MAX_CHARS]


def export(folder: str | os.PathLike, names=tuple(CORPORA)) -> list[Path]:
    """Write each corpus to folder/<name>.txt (what CRISP_TRT_TEXTS points at elsewhere)."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in names:
        path = out / f"{name}.txt"
        path.write_text(corpus(name), encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    import sys

    for p in export(sys.argv[1] if len(sys.argv) > 1 else "texts"):
        print(p, p.stat().st_size)
