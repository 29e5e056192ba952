"""Run Triton kernels in the interpreter where no GPU exists (must happen before triton.jit runs)."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

HAS_GPU = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run scripts/device/gpu_check.sh on one)")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip)


@pytest.fixture
def device():
    """The device kernels run on: CUDA when present, else CPU tensors under TRITON_INTERPRET=1."""
    return "cuda" if HAS_GPU else "cpu"
