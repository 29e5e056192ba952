"""seq_bounds: one sequence's (start, length) from cu_seqlens, clamped so no kernel can go out of bounds.

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
