/*
 * Kernel launch layer: the only place the plugin touches kernels.
 *
 * The kernels are the Triton kernels of crisp_trt/kernels/ (the same ones the torch op runs), compiled
 * ahead of time into cubins (scripts/, one per CUDA architecture) and launched here through the CUDA
 * driver API (cuModuleLoadData + cuLaunchKernel), never reimplemented in C++. The four stages keep
 * their Python names:
 *
 *   estimate  q[last window], k      -> vmass[H, tokens], smass[H, tokens]   (proxy map statistics)
 *   route     vmass, smass           -> cstruct[H], route[H]                 (C_struct >= tau: vertical-slash)
 *   select    vmass, smass, q, k     -> lists[H, qblocks, maxList], counts[H, qblocks]
 *   attend    q, k, v, lists, counts -> out                                  (causal sparse flash attention)
 *
 * Sequences shorter than dense_below run the attend kernel over every causal block. Every buffer lives
 * in the workspace described by crispWorkspaceLayout(); the launches are asynchronous on `stream` and do
 * no host synchronisation, so the plugin is CUDA-graph safe. Triton's hidden trailing scratch pointers
 * are passed as part of the workspace.
 */
#pragma once

#include "crispPrefillAttentionParams.h"

#include <cstddef>
#include <cstdint>
#include <cuda_runtime_api.h>

namespace crisp
{

//! Byte offsets of the estimate/select buffers inside the plugin workspace (each 256-byte aligned).
struct CrispWorkspaceLayout
{
    size_t vmass;   //!< float [numHeads, qBlocks * blockSize]
    size_t smass;   //!< float [numHeads, qBlocks * blockSize]
    size_t cstruct; //!< float [numHeads, batch]
    size_t route;   //!< int32 [numHeads, batch]
    size_t lists;   //!< int32 [numHeads, qBlocks, maxList]  key-block indices per query block
    size_t counts;  //!< int32 [numHeads, qBlocks]           valid entries of each list
    size_t total;   //!< bytes of the whole workspace
};

//! Layout for at most `maxTokens` packed tokens in at most `maxBatch` sequences (qBlocks bounds the query
//! blocks of all sequences: ceil(maxTokens / blockSize) + maxBatch).
CrispWorkspaceLayout crispWorkspaceLayout(CrispParams const& params, int64_t maxTokens, int64_t maxBatch) noexcept;

//! One enqueue's tensors. q/out: [tokens, numHeads, headDim]; k/v: [tokens, numKvHeads, headDim], packed,
//! contiguous; cuSeqlens: int32 [batch + 1], cuSeqlens[0] = 0, cuSeqlens[batch] = tokens.
struct CrispLaunchArgs
{
    CrispParams const* params;
    bool bf16; //!< element type of q, k, v, out: bfloat16 if true, else float16
    int64_t tokens;
    int64_t batch;
    int64_t maxSeqLen; //!< the profile's bound on one sequence's length (sizes the grids)
    void const* q;
    void const* k;
    void const* v;
    int32_t const* cuSeqlens;
    void* out;
    void* workspace; //!< crispWorkspaceLayout(*params, tokens, batch).total bytes or more
};

//! Launch estimate -> route -> select -> attend on `stream`. Returns 0 on success, else a non-zero status
//! after logging the reason (no kernels built for this device, a launch failure).
int32_t crispLaunchPrefill(CrispLaunchArgs const& args, cudaStream_t stream) noexcept;

} // namespace crisp
