#include "crispPrefillAttentionKernels.h"
#include "crispPrefillAttentionImages.h"
#include "crispPrefillAttentionLogging.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace crisp
{
namespace
{

constexpr int32_t kMAX_PARAMS = 48;
constexpr int64_t kMAX_GRID_X = std::numeric_limits<int32_t>::max();
constexpr int64_t kMAX_GRID_YZ = 65535;

using Grid = std::array<int64_t, 3>;

std::string cudaMessage(std::string const& what, cudaError_t status)
{
    return what + ": " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")";
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

//! Launches stages on one stream with one table of named arguments: each stage's cubin is the one for the
//! current device and dtype whose variant constexprs equal the arguments of the same name, and its parameters
//! are taken from the table by name.
class Launcher
{
public:
    template <size_t N>
    Launcher(std::array<CrispArg, N> const& args, bool bf16, cudaStream_t stream)
        : mArgs(args.data())
        , mNbArgs(N)
        , mBf16(bf16)
        , mStream(stream)
    {
    }

    //! Queries the current device; 0, else 1 after logging why.
    int32_t init()
    {
        int32_t major = 0;
        int32_t minor = 0;
        cudaError_t status = cudaGetDevice(&mDevice);
        if (status == cudaSuccess)
            status = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, mDevice);
        if (status == cudaSuccess)
            status = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, mDevice);
        if (status != cudaSuccess)
        {
            logError(cudaMessage("enqueue: querying the current device", status));
            return 1;
        }
        mArch = major * 10 + minor;
        return 0;
    }

    //! Launch `stage` on `g`. Returns 0, else 1 after logging why.
    int32_t operator()(char const* stage, Grid const& g)
    {
        int32_t count = 0;
        CrispKernelImage const* images = crispKernelImages(count);
        auto const* image = std::find_if(images, images + count, [&](CrispKernelImage const& i) { return matches(i, stage); });
        if (image == images + count)
        {
            logError("enqueue: this build embeds no " + describe(stage, images, count) + " kernel (" + std::to_string(count)
                + " cubins; rebuild with -DCRISP_TRT_CUDA_ARCHITECTURES / -DCRISP_TRT_HEAD_DIMS, plugin/README.md)");
            return 1;
        }
        if (g[0] < 1 || g[1] < 1 || g[2] < 1 || g[0] > kMAX_GRID_X || g[1] > kMAX_GRID_YZ || g[2] > kMAX_GRID_YZ)
        {
            logError(std::string("enqueue: ") + stage + " grid (" + std::to_string(g[0]) + ", " + std::to_string(g[1])
                + ", " + std::to_string(g[2]) + ") is out of CUDA's range");
            return 1;
        }
        cudaKernel_t kernel = kernelCache().get(static_cast<int32_t>(image - images), *image, mDevice);
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
            CrispArg const* a = find(image->params[i].name);
            if (a == nullptr || a->type != image->params[i].type
                || (a->type == CrispParamType::kINT32
                    && (a->integer < std::numeric_limits<int32_t>::min()
                        || a->integer > std::numeric_limits<int32_t>::max())))
            {
                logError(std::string(stage) + ": no int32/float/pointer launch argument for kernel parameter "
                    + image->params[i].name);
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
        dim3 const blocks(static_cast<uint32_t>(g[0]), static_cast<uint32_t>(g[1]), static_cast<uint32_t>(g[2]));
        cudaError_t const status = cudaLaunchKernel(reinterpret_cast<void const*>(kernel), blocks,
            dim3(32 * image->numWarps), params, static_cast<size_t>(image->sharedBytes), mStream);
        if (status != cudaSuccess)
        {
            logError(cudaMessage(std::string(stage) + ": launch", status));
            return 1;
        }
        return 0;
    }

private:
    CrispArg const* find(char const* name) const
    {
        auto const* end = mArgs + mNbArgs;
        auto const* found = std::find_if(mArgs, end, [name](CrispArg const& a) { return std::strcmp(a.name, name) == 0; });
        return found == end ? nullptr : found;
    }

    bool matches(CrispKernelImage const& image, char const* stage) const
    {
        CrispDtype const dtype = mBf16 ? CrispDtype::kBF16 : CrispDtype::kFP16;
        if (std::strcmp(image.stage, stage) != 0 || image.arch != mArch
            || (image.dtype != CrispDtype::kANY && image.dtype != dtype))
        {
            return false;
        }
        for (int32_t i = 0; i < image.nbConstexprs; ++i)
        {
            CrispConstexpr const& c = image.constexprs[i];
            CrispArg const* a = find(c.name);
            if (c.variant && (a == nullptr || a->type != CrispParamType::kINT32 || a->integer != c.value))
            {
                return false;
            }
        }
        return true;
    }

    //! "select sm_90 bf16 D=128 FLOOR=1 MIN_TOP=1": what a launch asked for (its variant arguments).
    std::string describe(char const* stage, CrispKernelImage const* images, int32_t count) const
    {
        std::string text = std::string(stage) + " sm_" + std::to_string(mArch) + (mBf16 ? " bf16" : " fp16");
        auto const* image = std::find_if(
            images, images + count, [stage](CrispKernelImage const& i) { return std::strcmp(i.stage, stage) == 0; });
        for (int32_t i = 0; image != images + count && i < image->nbConstexprs; ++i)
        {
            CrispArg const* a = find(image->constexprs[i].name);
            if (image->constexprs[i].variant && a != nullptr)
            {
                text += std::string(" ") + a->name + "=" + std::to_string(a->integer);
            }
        }
        return text;
    }

    CrispArg const* mArgs;
    size_t mNbArgs;
    bool mBf16;
    cudaStream_t mStream;
    int32_t mDevice{0};
    int32_t mArch{0};
};

bool aligned(void const* p)
{
    return reinterpret_cast<uintptr_t>(p) % kCRISP_TENSOR_ALIGN == 0;
}

} // namespace

int64_t crispMaxTokens() noexcept
{
    // The kernels compute NB * BLOCK (a multiple of the block size >= tokens) in int32.
    return std::numeric_limits<int32_t>::max() - 128;
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
        if (a.tokens < 0 || a.tokens > maxTokens || a.tokensK < 0 || a.tokensK > maxTokens || a.batch < 1
            || a.batch > kMAX_GRID_YZ)
        {
            logError("enqueue: expected 0 < tokens, key tokens <= " + std::to_string(maxTokens)
                + " and 1 <= batch <= 65535, got tokens " + std::to_string(a.tokens) + ", key tokens "
                + std::to_string(a.tokensK) + ", batch " + std::to_string(a.batch));
            return 1;
        }
        if (!aligned(a.q) || !aligned(a.k) || !aligned(a.v) || !aligned(a.out) || !aligned(a.cuSeqlens)
            || !aligned(a.cuSeqlensK) || !aligned(a.lse) || !aligned(a.workspace))
        {
            logError("enqueue: q, k, v, cu_seqlens, cu_seqlens_k, out, lse and the workspace must be 16-byte aligned");
            return 1;
        }
        if ((p.returnLse != 0) != (a.lse != nullptr))
        {
            logError("enqueue: expected an lse pointer if and only if return_lse = 1");
            return 1;
        }
        // Sizes follow the keys: the op's default max_seqlen_k (= the packed key tokens).
        CrispSizes const z = crispSizes(p, a.tokensK);
        CrispWorkspaceLayout const w = crispWorkspaceLayout(p, a.batch, a.tokensK);
        if (w.total == std::numeric_limits<size_t>::max())
        {
            logError("enqueue: the workspace size overflows size_t");
            return 1;
        }
        auto* ws = static_cast<char*>(a.workspace);
        cudaError_t const zeroed = cudaMemsetAsync(ws, 0, w.zeroedBytes, stream);
        if (zeroed != cudaSuccess)
        {
            logError(cudaMessage("enqueue: zeroing the workspace", zeroed));
            return 1;
        }
        // The generated contract (crispPrefillAttentionContract.h): every argument by kernel parameter name, and
        // the launches in crisp_trt/kernels/pipeline.py's order with their grids.
        auto const args = crispLaunchArgs(p, z, w, ws,
            CrispTensors{a.q, a.k, a.v, a.out, a.cuSeqlens, a.cuSeqlensK, a.lse}, a.batch, a.tokens, a.tokensK);
        Launcher launch(args, a.bf16, stream);
        int32_t status = launch.init();
        for (CrispLaunch const& l : crispLaunchOrder(p, z, a.batch, a.tokens, a.tokensK))
        {
            if (status == 0 && l.enabled)
            {
                status = launch(l.stage, Grid{l.grid[0], l.grid[1], l.grid[2]});
            }
        }
        return status;
    }
    catch (std::exception const& e)
    {
        logError(std::string("enqueue: ") + e.what());
        return 1;
    }
}

} // namespace crisp
