/*
 * Kernel launch layer: the only place the plugin touches kernels.
 *
 * The kernels are the Triton kernels of crisp_trt/kernels/ (the same ones the torch op runs), compiled
 * ahead of time into cubins by crisp_trt/kernels/aot.py (crispPrefillAttentionImages.h) and launched here
 * through the CUDA runtime's library API (cudaLibraryLoadData, cudaLibraryGetKernel, cudaLaunchKernel),
 * never reimplemented in C++. crispLaunchPrefill makes crisp_trt/kernels/pipeline.py's launches, with its grids
 * and arguments and max_seqlen = tokens (the op's default), so its output is the op's, bit for bit:
 *   zero (s_mass, keep maps, counts, poison flag) -> estimate_partial -> estimate_mass -> slash_reduce -> pool
 *   -> route (-> route_jsd) -> select -> attend -> poison_scan -> poison_apply.
 * Sizes, workspace layout, launch order, grids and arguments come from the generated
 * crispPrefillAttentionContract.h (crisp_trt/kernels/contract.py); the launches are asynchronous on `stream`
 * and do no host synchronisation, so the plugin is CUDA-graph safe once a device's cubins are loaded (on its
 * first enqueue).
 */
#pragma once

#include "crispPrefillAttentionParams.h"

#include <cstddef>
#include <cstdint>
#include <cuda_runtime_api.h>

namespace crisp
{

//! The most packed tokens one enqueue accepts (the kernels index tokens with int32).
int64_t crispMaxTokens() noexcept;

//! One enqueue's tensors. q/out: [tokens, numHeads, headDim]; k/v: [tokensK, numKvHeads, headDim], packed,
//! contiguous, 16-byte aligned; cuSeqlens: int32 [batch + 1], cuSeqlens[0] = 0, cuSeqlens[batch] = tokens;
//! cuSeqlensK: the same for the keys (cuSeqlens itself, and tokensK = tokens, for whole prompts: a chunk's queries
//! are the last positions of its sequence's keys); lse: f32 [tokens, numHeads] or null (params->returnLse = 0).
struct CrispLaunchArgs
{
    CrispParams const* params;
    bool bf16; //!< element type of q, k, v, out: bfloat16 if true, else float16
    int64_t tokens;
    int64_t tokensK;
    int64_t batch;
    void const* q;
    void const* k;
    void const* v;
    int32_t const* cuSeqlens;
    int32_t const* cuSeqlensK;
    void* out;
    float* lse;
    void* workspace; //!< crispWorkspaceLayout(*params, batch, tokensK).total bytes or more
};

//! Launch the pipeline on `stream`. Returns 0 on success, else a non-zero status after logging the reason
//! (more tokens than crispMaxTokens(), no cubin for this device or configuration, misaligned buffers, a load or
//! launch failure).
int32_t crispLaunchPrefill(CrispLaunchArgs const& args, cudaStream_t stream) noexcept;

} // namespace crisp
