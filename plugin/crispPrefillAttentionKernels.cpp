#include "crispPrefillAttentionKernels.h"
#include "crispPrefillAttentionLogging.h"

#include <algorithm>

namespace crisp
{
namespace
{

size_t alignUp(size_t bytes)
{
    constexpr size_t kALIGN = 256;
    return (bytes + kALIGN - 1) / kALIGN * kALIGN;
}

// CrispConfig.max_list: capacity of one query block's key-block list.
int64_t maxList(CrispParams const& p, int64_t numBlocks)
{
    int64_t const sinkBlocks = (p.sinkTokens + p.blockSize - 1) / p.blockSize;
    int64_t const maxBlocks = p.maxBudget / p.blockSize;
    int64_t const verticalSlash = sinkBlocks + maxBlocks + 2 * (maxBlocks + p.localBlocks);
    int64_t const blockSparse = sinkBlocks + p.localBlocks + maxBlocks;
    return std::max<int64_t>(1, std::min(numBlocks, std::max(verticalSlash, blockSparse)));
}

} // namespace

CrispWorkspaceLayout crispWorkspaceLayout(CrispParams const& p, int64_t maxTokens, int64_t maxBatch) noexcept
{
    auto const tokens = static_cast<size_t>(std::max<int64_t>(maxTokens, 0));
    auto const batch = static_cast<size_t>(std::max<int64_t>(maxBatch, 1));
    size_t const heads = static_cast<size_t>(p.numHeads);
    size_t const qBlocks = (tokens + p.blockSize - 1) / p.blockSize + batch;
    auto const list = static_cast<size_t>(maxList(p, static_cast<int64_t>(qBlocks)));
    CrispWorkspaceLayout w{};
    size_t at = 0;
    auto const take = [&at](size_t bytes) {
        size_t const offset = at;
        at += alignUp(bytes);
        return offset;
    };
    w.vmass = take(heads * qBlocks * p.blockSize * sizeof(float));
    w.smass = take(heads * qBlocks * p.blockSize * sizeof(float));
    w.cstruct = take(heads * batch * sizeof(float));
    w.route = take(heads * batch * sizeof(int32_t));
    w.lists = take(heads * qBlocks * list * sizeof(int32_t));
    w.counts = take(heads * qBlocks * sizeof(int32_t));
    w.total = at;
    return w;
}

int32_t crispLaunchPrefill(CrispLaunchArgs const& /* args */, cudaStream_t /* stream */) noexcept
{
    // The AOT cubins of crisp_trt/kernels/ are not embedded yet (plugin/README.md, "Status").
    logError("enqueue: this build of libcrisp_trt_plugin.so embeds no CRISP kernels yet");
    return 1;
}

} // namespace crisp
