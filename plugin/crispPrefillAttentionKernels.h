/*
 * Kernel launch layer: the only place the plugin touches kernels.
 *
 * The kernels are the Triton kernels of crisp_trt/kernels/ (the same ones the torch op runs), compiled
 * ahead of time into cubins by scripts/aot_compile.py (crispPrefillAttentionImages.h) and launched here
 * through the CUDA runtime's library API (cudaLibraryLoadData, cudaLibraryGetKernel, cudaLaunchKernel),
 * never reimplemented in C++. crispLaunchPrefill repeats crisp_trt/kernels/pipeline.py's launches, grids and
 * arguments with max_seqlen = tokens (the op's default), so its output is the op's, bit for bit:
 *   zero (s_mass, keep maps, counts, poison flag) -> estimate_partial -> estimate_mass -> slash_reduce -> pool
 *   -> route (-> route_jsd) -> select -> attend -> poison_scan -> poison_apply.
 * Every buffer lives in the workspace described by crispWorkspaceLayout() (crisp_trt.kernels.launch.buffers,
 * in the same order); the launches are asynchronous on `stream` and do no host synchronisation, so the plugin
 * is CUDA-graph safe once a device's cubins are loaded (on its first enqueue).
 */
#pragma once

#include "crispPrefillAttentionParams.h"

#include <cstddef>
#include <cstdint>
#include <cuda_runtime_api.h>

namespace crisp
{

//! Strides and capacities of one launch (crisp_trt.kernels.launch.Sizes.of).
struct CrispSizes
{
    int64_t nb;         //!< blocks of the longest sequence: ceil(maxSeqlen / blockSize)
    int64_t chunk;      //!< key blocks per estimate chunk
    int64_t nch;        //!< estimate chunks (<= 64)
    int64_t nchCap;     //!< part_m / part_l rows, a bound on nch that grows with nb
    int64_t maxc;       //!< column list capacity
    int64_t maxd;       //!< distance list capacity
    int64_t maxk;       //!< key-block list capacity (attend's idx)
    int64_t routeChunk; //!< route's chunk C
};

CrispSizes crispSizes(CrispParams const& params, int64_t maxSeqlen) noexcept;

//! Byte offsets of the pipeline's buffers inside the workspace, in crisp_trt.kernels.launch.buffers' order (each
//! 256-byte aligned); the buffers before `zeroedBytes` are zeroed at every enqueue. A byte count that would not
//! fit in size_t saturates `total` at SIZE_MAX.
struct CrispWorkspaceLayout
{
    size_t sMass, columns, offsets, distances, counts, poison; //!< zeroed
    size_t zeroedBytes;
    size_t partM, partL, vsum, vmax, ssum, smax, pooledQ, pooledK, cols, dists, ncols, ndists, route, cStruct, dense,
        scratch, idx;
    size_t total; //!< bytes of the whole workspace
};

//! The most packed tokens one enqueue accepts (the kernels index tokens with int32).
int64_t crispMaxTokens() noexcept;

//! Layout for `batch` sequences of at most `maxSeqlen` tokens; grows with both, so the layout of the profile's
//! maximum shapes holds that of every enqueue.
CrispWorkspaceLayout crispWorkspaceLayout(CrispParams const& params, int64_t batch, int64_t maxSeqlen) noexcept;

//! One enqueue's tensors. q/out: [tokens, numHeads, headDim]; k/v: [tokens, numKvHeads, headDim], packed,
//! contiguous, 16-byte aligned; cuSeqlens: int32 [batch + 1], cuSeqlens[0] = 0, cuSeqlens[batch] = tokens.
struct CrispLaunchArgs
{
    CrispParams const* params;
    bool bf16; //!< element type of q, k, v, out: bfloat16 if true, else float16
    int64_t tokens;
    int64_t batch;
    void const* q;
    void const* k;
    void const* v;
    int32_t const* cuSeqlens;
    void* out;
    void* workspace; //!< crispWorkspaceLayout(*params, batch, tokens).total bytes or more
};

//! Launch the pipeline on `stream`. Returns 0 on success, else a non-zero status after logging the reason
//! (more tokens than crispMaxTokens(), no cubin for this device or configuration, misaligned buffers, a load or
//! launch failure).
int32_t crispLaunchPrefill(CrispLaunchArgs const& args, cudaStream_t stream) noexcept;

} // namespace crisp
