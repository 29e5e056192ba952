"""seq_bounds / chunk_bounds: one sequence's extent from cu_seqlens (and cu_seqlens_k), clamped so no kernel can go
out of bounds.

On CUDA the op cannot check cu_seqlens on the host without a sync; a malformed one poisons the output
to NaN (poison.py), and this clamp keeps every read inside [0, total) and every write
inside the buffers sized for `cap` tokens (max_seqlen rounded up to blocks) meanwhile.
"""
import triton
import triton.language as tl


@triton.jit
def seq_bounds(cu_ptr, s, total, cap):
    start = tl.minimum(tl.maximum(tl.load(cu_ptr + s), 0), total)
    end = tl.minimum(tl.maximum(tl.load(cu_ptr + s + 1), start), total)
    return start, tl.minimum(end - start, cap)


@triton.jit
def chunk_bounds(cu_ptr, cu_k_ptr, s, total, total_k, cap):
    """(q_start, q_len, k_start, kv_len) of sequence s: its keys from cu_k, its queries (from cu) the last q_len ≤
    kv_len positions of them (a chunked prefill; cu_k = cu for whole prompts). A sequence with no queries
    counts as having no keys: there is nothing to plan or attend."""
    q_start, q_len = seq_bounds(cu_ptr, s, total, cap)
    k_start, kv_len = seq_bounds(cu_k_ptr, s, total_k, cap)
    q_len = tl.minimum(q_len, kv_len)
    return q_start, q_len, k_start, tl.where(q_len > 0, kv_len, 0)
