"""CrispStats: what the pipeline decided, per sequence and head (returned with return_stats=True)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

ROUTE_NAMES = {0: "dense", 1: "vertical_slash", 2: "block_sparse"}


@dataclass
class CrispStats:
    """route [S, H] (0 dense, 1 vertical-slash, 2 block-sparse), c_struct [S, H] (the structural coverage
    that routed the head: vertical-slash iff ≥ tau; taken before the trim), density [S, H]: the fraction
    of causal blocks attended (of a chunk: over the query blocks it touches). A sequence with no queries
    reports route 0, C_struct 0 and density 0."""

    route: torch.Tensor
    c_struct: torch.Tensor
    density: torch.Tensor

    @property
    def mean_density(self) -> float:
        """Mean density over sequences and heads (host sync: call outside the hot path)."""
        return float(self.density.float().mean())

    def route_names(self) -> list[list[str]]:
        return [[ROUTE_NAMES[int(r)] for r in row] for row in self.route.cpu()]

    def __getitem__(self, key: str) -> torch.Tensor:  # dict-style access: stats["density"]
        return getattr(self, key)
