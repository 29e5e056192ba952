"""Token lengths as users type them on every command line (crisp-build --max-seq, crisp-bench --lengths):
8k, 512k, 1M or 131072, with k = 1024 and M = 1024²."""
from __future__ import annotations

import re


def parse_length(text: str | int) -> int:
    """'8k' → 8192, '512k' → 524288, '1M' → 1048576, '131072' → 131072 (k = 1024, M = 1024²)."""
    if isinstance(text, int):
        value = text
    else:
        m = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)\s*", str(text))
        if not m:
            raise ValueError(f"{text!r}: expected a length like 8k, 512k, 1M or 131072")
        value = int(m.group(1)) * {"": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}[m.group(2).lower()]
    if value < 1:
        raise ValueError(f"{text!r}: a length must be positive")
    return value
