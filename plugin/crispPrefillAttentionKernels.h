/*
 * Kernel launch layer: the only place the plugin touches kernels.
 *
 * The kernels are the Triton kernels of crisp_trt/kernels/ (the same ones the torch op runs), compiled
 * ahead of time into cubins by scripts/aot_compile.py (crispPrefillAttentionImages.h) and launched here
 * through the CUDA runtime's library API (cudaLibraryLoadData, cudaLibraryGetKernel, cudaLaunchKernel),
 * never reimplemented in C++. The pipeline keeps the Python stage names (estimate -> route -> select ->
 * attend, crisp_trt/kernels/pipeline.py).
 *
 * Status: only attend is embedded, so every sequence is attended densely (dense[s] = 1: exact causal
 * attention, what crisp_trt.crisp_prefill_attention computes for such a sequence); estimate/route/select
 * join here, in pipeline.py's order, once they exist in crisp_trt/kernels/. Every buffer lives in the
 * workspace described by crispWorkspaceLayout(); the launches are asynchronous on `stream` and do no host
 * synchronisation, so the plugin is CUDA-graph safe once a device's cubins are loaded (on its first enqueue).
 */
#pragma once

#include "crispPrefillAttentionParams.h"

#include <cstddef>
#include <cstdint>
#include <cuda_runtime_api.h>

namespace crisp
{

//! Byte offsets of attend's inputs inside the plugin workspace (each 256-byte aligned). The dense path lays
//! idx/counts out as attend's [batch, numHeads, NQB, MAXK = 1] with the NQB its cubins are built with
//! (ceil(crispKernelMaxSeqLen() / blockSize), scripts/aot_kernels.py); attend reads them but multiplies them
//! by 0 while dense[s] = 1.
struct CrispWorkspaceLayout
{
    size_t dense;  //!< int32 [batch]: 1 = attend every causal block of sequence s
    size_t idx;    //!< int32 [batch, numHeads, NQB]: key-block lists
    size_t counts; //!< int32 [batch, numHeads, NQB]: valid entries of each list
    size_t total;  //!< bytes of the whole workspace
};

//! The most packed tokens one enqueue accepts: the embedded kernels' max_seqlen (at most 2^31 - 1).
int64_t crispMaxTokens() noexcept;

//! attend's NQB: query blocks of the longest sequence the embedded kernels accept.
int64_t crispQueryBlocks(CrispParams const& params) noexcept;

//! Layout for at most `maxBatch` sequences.
CrispWorkspaceLayout crispWorkspaceLayout(CrispParams const& params, int64_t maxBatch) noexcept;

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
    void* workspace; //!< crispWorkspaceLayout(*params, batch).total bytes or more
};

//! Launch the pipeline on `stream`. Returns 0 on success, else a non-zero status after logging the reason
//! (more tokens than crispKernelMaxSeqLen(), no cubin for this device or configuration, misaligned buffers,
//! a load or launch failure).
int32_t crispLaunchPrefill(CrispLaunchArgs const& args, cudaStream_t stream) noexcept;

} // namespace crisp
