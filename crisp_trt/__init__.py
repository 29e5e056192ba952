"""crisp-trt: CRISP sparse prefill attention (estimate → route → select → attend) for long-context LLMs."""
from .api import crisp_prefill_attention, dense_prefill_attention
from .config import CrispConfig, method_config
from .stats import CrispStats

__all__ = ["CrispConfig", "CrispStats", "crisp_prefill_attention", "dense_prefill_attention", "method_config"]
__version__ = "0.1.0"
