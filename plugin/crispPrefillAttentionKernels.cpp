#include "crispPrefillAttentionKernels.h"
#include "crispPrefillAttentionImages.h"
#include "crispPrefillAttentionLogging.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace crisp
{
namespace
{

constexpr size_t kALIGN = 256;
constexpr uintptr_t kTENSOR_ALIGN = 16; // the cubins assume 16-byte aligned pointers (scripts/aot_kernels.py)
constexpr int32_t kMAX_PARAMS = 32;
constexpr int64_t kMAX_GRID_YZ = 65535;

size_t alignUp(size_t bytes)
{
    return (bytes + kALIGN - 1) / kALIGN * kALIGN;
}

std::string cudaMessage(std::string const& what, cudaError_t status)
{
    return what + ": " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")";
}

//! A launch argument, matched to a kernel parameter (or a cubin's constexpr) by name.
struct Arg
{
    char const* name;
    CrispParamType type;
    void const* pointer;
    int64_t integer;
    float real;
};

Arg pointerArg(char const* name, void const* value)
{
    return {name, CrispParamType::kPOINTER, value, 0, 0.F};
}

Arg intArg(char const* name, int64_t value)
{
    return {name, CrispParamType::kINT32, nullptr, value, 0.F};
}

Arg floatArg(char const* name, float value)
{
    return {name, CrispParamType::kFLOAT32, nullptr, 0, value};
}

template <size_t N>
Arg const* findArg(Arg const (&args)[N], char const* name)
{
    auto const* found = std::find_if(args, args + N, [name](Arg const& a) { return std::strcmp(a.name, name) == 0; });
    return found == args + N ? nullptr : found;
}

template <size_t N>
bool matches(CrispKernelImage const& image, char const* stage, int32_t arch, bool bf16, Arg const (&args)[N])
{
    if (std::strcmp(image.stage, stage) != 0 || image.arch != arch || image.bf16 != bf16)
    {
        return false;
    }
    for (int32_t i = 0; i < image.nbConstexprs; ++i)
    {
        Arg const* a = findArg(args, image.constexprs[i].name);
        if (a == nullptr || a->type != CrispParamType::kINT32 || a->integer != image.constexprs[i].value)
        {
            return false;
        }
    }
    return true;
}

//! "attend sm_90 bf16 H=32 G=4 BLOCK=128 D=128": what a launch asked for (its integer arguments).
template <size_t N>
std::string describe(char const* stage, int32_t arch, bool bf16, Arg const (&args)[N])
{
    std::string text = std::string(stage) + " sm_" + std::to_string(arch) + (bf16 ? " bf16" : " fp16");
    for (Arg const& a : args)
    {
        if (a.type == CrispParamType::kINT32)
        {
            text += std::string(" ") + a.name + "=" + std::to_string(a.integer);
        }
    }
    return text;
}

//! The loaded kernels. A cubin's library is loaded once per process (context-independent loading) and kept
//! for its lifetime: unloading at exit would race the CUDA runtime's own teardown. Large dynamic shared
//! memory is opted into once per (device, cubin).
class KernelCache
{
public:
    //! The kernel of image `index`, ready to launch on `device`; nullptr after logging why.
    cudaKernel_t get(int32_t index, CrispKernelImage const& image, int32_t device)
    {
        std::lock_guard<std::mutex> lock(mMutex);
        auto const ready = mReady.find({device, index});
        if (ready != mReady.end())
        {
            return ready->second;
        }
        cudaKernel_t kernel = load(index, image);
        if (kernel == nullptr)
        {
            return nullptr;
        }
        int32_t optin = 0;
        cudaError_t status = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
        if (status == cudaSuccess && image.sharedBytes > optin)
        {
            logError(std::string(image.stage) + ": the cubin needs " + std::to_string(image.sharedBytes)
                + " bytes of shared memory, device " + std::to_string(device) + " allows "
                + std::to_string(optin));
            return nullptr;
        }
        if (status == cudaSuccess)
        {
            status = cudaKernelSetAttributeForDevice(
                kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, image.sharedBytes, device);
        }
        if (status != cudaSuccess)
        {
            logError(cudaMessage(std::string(image.stage) + ": shared memory opt-in", status));
            return nullptr;
        }
        mReady.emplace(std::make_pair(device, index), kernel);
        return kernel;
    }

private:
    cudaKernel_t load(int32_t index, CrispKernelImage const& image)
    {
        auto const loaded = mKernels.find(index);
        if (loaded != mKernels.end())
        {
            return loaded->second;
        }
        cudaLibrary_t library{};
        cudaError_t status = cudaLibraryLoadData(&library, image.cubin, nullptr, nullptr, 0, nullptr, nullptr, 0);
        cudaKernel_t kernel{};
        if (status == cudaSuccess)
        {
            status = cudaLibraryGetKernel(&kernel, library, image.kernel);
        }
        if (status != cudaSuccess)
        {
            logError(cudaMessage(std::string(image.stage) + ": loading the sm_" + std::to_string(image.arch)
                    + " cubin (entry " + image.kernel + ")",
                status));
            return nullptr;
        }
        mKernels.emplace(index, kernel);
        return kernel;
    }

    std::mutex mMutex;
    std::map<int32_t, cudaKernel_t> mKernels;
    std::map<std::pair<int32_t, int32_t>, cudaKernel_t> mReady;
};

KernelCache& kernelCache()
{
    static KernelCache cache;
    return cache;
}

//! Launch the cubin of `stage` for the current device whose constexprs match `args`, with its parameters
//! taken from `args` by name. Returns 0, else 1 after logging why.
template <size_t N>
int32_t launch(char const* stage, bool bf16, Arg const (&args)[N], dim3 grid, cudaStream_t stream)
{
    int32_t device = 0;
    int32_t major = 0;
    int32_t minor = 0;
    cudaError_t status = cudaGetDevice(&device);
    if (status == cudaSuccess)
        status = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (status == cudaSuccess)
        status = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    if (status != cudaSuccess)
    {
        logError(cudaMessage(std::string(stage) + ": querying the current device", status));
        return 1;
    }
    int32_t const arch = major * 10 + minor;
    int32_t count = 0;
    CrispKernelImage const* images = crispKernelImages(count);
    auto const* image
        = std::find_if(images, images + count, [&](CrispKernelImage const& i) { return matches(i, stage, arch, bf16, args); });
    if (image == images + count)
    {
        logError("enqueue: this build embeds no " + describe(stage, arch, bf16, args) + " kernel (" + std::to_string(count)
            + " cubins; rebuild with -DCRISP_TRT_CUDA_ARCHITECTURES / -DCRISP_TRT_HEADS, plugin/README.md)");
        return 1;
    }
    cudaKernel_t kernel = kernelCache().get(static_cast<int32_t>(image - images), *image, device);
    if (kernel == nullptr)
    {
        return 1;
    }
    if (image->nbParams > kMAX_PARAMS)
    {
        logError(std::string(stage) + ": too many kernel parameters");
        return 1;
    }
    union Slot
    {
        void const* pointer;
        int32_t integer;
        float real;
    } slots[kMAX_PARAMS];
    void* params[kMAX_PARAMS];
    for (int32_t i = 0; i < image->nbParams; ++i)
    {
        Arg const* a = findArg(args, image->params[i].name);
        if (a == nullptr || a->type != image->params[i].type)
        {
            logError(std::string(stage) + ": no launch argument for kernel parameter " + image->params[i].name);
            return 1;
        }
        switch (a->type)
        {
        case CrispParamType::kPOINTER: slots[i].pointer = a->pointer; break;
        case CrispParamType::kINT32: slots[i].integer = static_cast<int32_t>(a->integer); break;
        case CrispParamType::kFLOAT32: slots[i].real = a->real; break;
        }
        params[i] = &slots[i];
    }
    status = cudaLaunchKernel(reinterpret_cast<void const*>(kernel), grid, dim3(32 * image->numWarps), params,
        static_cast<size_t>(image->sharedBytes), stream);
    if (status != cudaSuccess)
    {
        logError(cudaMessage(std::string(stage) + ": launch", status));
        return 1;
    }
    return 0;
}

bool aligned(void const* p)
{
    return reinterpret_cast<uintptr_t>(p) % kTENSOR_ALIGN == 0;
}

} // namespace

int64_t crispMaxTokens() noexcept
{
    return std::min<int64_t>(crispKernelMaxSeqLen(), std::numeric_limits<int32_t>::max());
}

int64_t crispQueryBlocks(CrispParams const& p) noexcept
{
    return (crispKernelMaxSeqLen() + p.blockSize - 1) / p.blockSize;
}

CrispWorkspaceLayout crispWorkspaceLayout(CrispParams const& p, int64_t maxBatch) noexcept
{
    auto const batch = static_cast<size_t>(std::max<int64_t>(maxBatch, 1));
    size_t const rows = batch * static_cast<size_t>(p.numHeads) * static_cast<size_t>(crispQueryBlocks(p));
    CrispWorkspaceLayout w{};
    size_t at = 0;
    auto const take = [&at](size_t bytes) {
        size_t const offset = at;
        at += alignUp(bytes);
        return offset;
    };
    w.dense = take(batch * sizeof(int32_t));
    w.idx = take(rows * sizeof(int32_t));
    w.counts = take(rows * sizeof(int32_t));
    w.total = at;
    return w;
}

int32_t crispLaunchPrefill(CrispLaunchArgs const& a, cudaStream_t stream) noexcept
{
    try
    {
        CrispParams const& p = *a.params;
        if (a.tokens == 0)
        {
            return 0;
        }
        int64_t const maxTokens = crispMaxTokens();
        if (a.tokens < 0 || a.tokens > maxTokens || a.batch < 1 || a.batch > kMAX_GRID_YZ)
        {
            logError("enqueue: expected 0 < tokens <= " + std::to_string(maxTokens)
                + " (the kernels' max_seqlen) and 1 <= batch <= 65535, got tokens " + std::to_string(a.tokens)
                + ", batch " + std::to_string(a.batch));
            return 1;
        }
        if (!aligned(a.q) || !aligned(a.k) || !aligned(a.v) || !aligned(a.out) || !aligned(a.cuSeqlens)
            || !aligned(a.workspace))
        {
            logError("enqueue: q, k, v, cu_seqlens, out and the workspace must be 16-byte aligned");
            return 1;
        }
        static std::once_flag warned;
        std::call_once(warned, [] {
            logWarning("enqueue: estimate/route/select are not embedded yet: every sequence is attended densely "
                       "(exact causal attention with the attend kernel)");
        });
        CrispWorkspaceLayout const w = crispWorkspaceLayout(p, a.batch);
        auto* ws = static_cast<char*>(a.workspace);
        // dense[s] = 1 (int32, little-endian: byte 0 of each element), idx = counts = 0.
        cudaError_t status = cudaMemsetAsync(ws, 0, w.total, stream);
        if (status == cudaSuccess)
        {
            status = cudaMemset2DAsync(ws + w.dense, sizeof(int32_t), 1, 1, static_cast<size_t>(a.batch), stream);
        }
        if (status != cudaSuccess)
        {
            logError(cudaMessage("enqueue: initialising the workspace", status));
            return 1;
        }
        int64_t const qBlocks = (a.tokens + p.blockSize - 1) / p.blockSize;
        Arg const args[] = {pointerArg("q_ptr", a.q), pointerArg("k_ptr", a.k), pointerArg("v_ptr", a.v),
            pointerArg("o_ptr", a.out), pointerArg("cu_ptr", a.cuSeqlens), pointerArg("idx_ptr", ws + w.idx),
            pointerArg("cnt_ptr", ws + w.counts), pointerArg("dense_ptr", ws + w.dense),
            floatArg("sm_scale", static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.headDim)))),
            intArg("total", a.tokens), intArg("H", p.numHeads), intArg("G", p.numHeads / p.numKvHeads),
            intArg("NQB", crispQueryBlocks(p)), intArg("MAXK", 1), intArg("BLOCK", p.blockSize), intArg("D", p.headDim),
            intArg("INTERPRET", 0), pointerArg("global_scratch", nullptr), pointerArg("profile_scratch", nullptr)};
        dim3 const grid(static_cast<uint32_t>(qBlocks), static_cast<uint32_t>(p.numHeads), static_cast<uint32_t>(a.batch));
        return launch("attend", a.bf16, args, grid, stream);
    }
    catch (std::exception const& e)
    {
        logError(std::string("enqueue: ") + e.what());
        return 1;
    }
}

} // namespace crisp
