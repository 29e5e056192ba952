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

constexpr size_t kALIGN = 256;
constexpr size_t kSATURATED = std::numeric_limits<size_t>::max();
constexpr uintptr_t kTENSOR_ALIGN = 16; // the cubins assume 16-byte aligned pointers (scripts/aot_kernels.py)
constexpr int32_t kMAX_PARAMS = 48;
constexpr int64_t kMAX_GRID_X = std::numeric_limits<int32_t>::max();
constexpr int64_t kMAX_GRID_YZ = 65535;
constexpr int64_t kKAPPA_HALVINGS = 3; // crisp_trt.config.KAPPA_HALVINGS: route's kappa ladder (CrispConfig.kappas)

using Grid = std::array<int64_t, 3>;

int64_t ceilDiv(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

//! a + b, or kSATURATED when it would not fit.
size_t addSat(size_t a, size_t b)
{
    return a > kSATURATED - b ? kSATURATED : a + b;
}

//! element * the product of `factors` (all >= 0), or kSATURATED when it would not fit.
size_t product(std::initializer_list<int64_t> factors, size_t element)
{
    size_t bytes = element;
    for (int64_t f : factors)
    {
        auto const u = static_cast<size_t>(f);
        if (u != 0 && bytes > kSATURATED / u)
        {
            return kSATURATED;
        }
        bytes *= u;
    }
    return bytes;
}

size_t alignUp(size_t bytes)
{
    return bytes > kSATURATED - kALIGN ? kSATURATED : (bytes + kALIGN - 1) / kALIGN * kALIGN;
}

std::string cudaMessage(std::string const& what, cudaError_t status)
{
    return what + ": " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")";
}

//! A launch argument, matched to a kernel parameter (or a cubin's variant constexpr) by name.
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

//! A fixed constexpr of a cubin (QG, RB, ELEMS, ...): what its grid is computed from; -1 if it has none.
int64_t constexprOf(CrispKernelImage const& image, char const* name)
{
    for (int32_t i = 0; i < image.nbConstexprs; ++i)
    {
        if (std::strcmp(image.constexprs[i].name, name) == 0)
        {
            return image.constexprs[i].value;
        }
    }
    return -1;
}

//! Launches stages on one stream with one table of named arguments: each stage's cubin is the one for the
//! current device and dtype whose variant constexprs equal the arguments of the same name, and its parameters
//! are taken from the table by name.
class Launcher
{
public:
    template <size_t N>
    Launcher(Arg const (&args)[N], bool bf16, cudaStream_t stream)
        : mArgs(args)
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

    //! Launch `stage` on the grid `grid(image)` computes from its cubin. Returns 0, else 1 after logging why.
    template <typename GridFn>
    int32_t operator()(char const* stage, GridFn const& grid)
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
        Grid const g = grid(*image);
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
            Arg const* a = find(image->params[i].name);
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
    Arg const* find(char const* name) const
    {
        auto const* end = mArgs + mNbArgs;
        auto const* found = std::find_if(mArgs, end, [name](Arg const& a) { return std::strcmp(a.name, name) == 0; });
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
            Arg const* a = find(c.name);
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
            Arg const* a = find(image->constexprs[i].name);
            if (image->constexprs[i].variant && a != nullptr)
            {
                text += std::string(" ") + a->name + "=" + std::to_string(a->integer);
            }
        }
        return text;
    }

    Arg const* mArgs;
    size_t mNbArgs;
    bool mBf16;
    cudaStream_t mStream;
    int32_t mDevice{0};
    int32_t mArch{0};
};

bool aligned(void const* p)
{
    return reinterpret_cast<uintptr_t>(p) % kTENSOR_ALIGN == 0;
}

} // namespace

int64_t crispMaxTokens() noexcept
{
    // The kernels compute NB * BLOCK (a multiple of the block size >= tokens) in int32.
    return std::numeric_limits<int32_t>::max() - 128;
}

CrispSizes crispSizes(CrispParams const& p, int64_t maxSeqlen) noexcept
{
    int64_t const block = p.blockSize;
    int64_t const nb = ceilDiv(std::max<int64_t>(maxSeqlen, 1), block);
    int64_t const sink = ceilDiv(p.sinkTokens, block);
    int64_t const maxBlocks = p.maxBudget / block;
    int64_t const local = p.localBlocks;
    CrispSizes z{};
    z.nb = nb;
    z.chunk = std::max<int64_t>(4, ceilDiv(nb, 64)); // <= 64 chunks: each estimate_mass program merges them all
    z.nch = ceilDiv(nb, z.chunk);
    z.nchCap = std::min<int64_t>(64, ceilDiv(nb, 4));
    z.maxc = std::max<int64_t>(1, std::min(nb, sink + maxBlocks));
    z.maxd = std::max<int64_t>(1, std::min(nb, 2 * (local + maxBlocks)));
    int64_t const verticalSlash = sink + maxBlocks + 2 * (maxBlocks + local);
    int64_t const blockSparse = sink + local + maxBlocks;
    z.maxk = std::max<int64_t>(1, std::min(nb, std::max(verticalSlash, blockSparse)));
    int64_t pow2 = 16;
    while (pow2 < nb && pow2 < 1024)
    {
        pow2 *= 2;
    }
    z.routeChunk = pow2;
    return z;
}

CrispWorkspaceLayout crispWorkspaceLayout(CrispParams const& p, int64_t batch, int64_t maxSeqlen) noexcept
{
    CrispSizes const z = crispSizes(p, maxSeqlen);
    int64_t const s = std::max<int64_t>(batch, 1);
    int64_t const h = p.numHeads;
    int64_t const nb = z.nb;
    size_t at = 0;
    auto const take = [&at](std::initializer_list<int64_t> factors, size_t element) {
        size_t const offset = at;
        at = addSat(at, alignUp(product(factors, element)));
        return offset;
    };
    CrispWorkspaceLayout w{};
    w.sMass = take({s, h, nb, p.blockSize}, sizeof(float));
    w.columns = take({s, h, nb}, 1);
    w.offsets = take({s, h, nb}, 1);
    w.distances = take({s, h, nb}, 1);
    w.counts = take({s, h, nb}, sizeof(int32_t));
    w.poison = take({1}, sizeof(int32_t));
    w.zeroedBytes = at;
    w.partM = take({s, h, z.nchCap, p.window()}, sizeof(float));
    w.partL = take({s, h, z.nchCap, p.window()}, sizeof(float));
    w.vsum = take({s, h, nb}, sizeof(float));
    w.vmax = take({s, h, nb}, sizeof(float));
    w.ssum = take({s, h, nb}, sizeof(float));
    w.smax = take({s, h, nb}, sizeof(float));
    w.pooledQ = take({s, nb, h, p.headDim}, sizeof(float));
    w.pooledK = take({s, nb, p.numKvHeads, p.headDim}, sizeof(float));
    w.cols = take({s, h, z.maxc}, sizeof(int32_t));
    w.dists = take({s, h, z.maxd}, sizeof(int32_t));
    w.ncols = take({s, h}, sizeof(int32_t));
    w.ndists = take({s, h}, sizeof(int32_t));
    w.route = take({s, h}, sizeof(int32_t));
    w.cStruct = take({s, h}, sizeof(float));
    w.dense = take({s}, sizeof(int32_t));
    w.scratch = take({s, h, nb, nb}, sizeof(float));
    w.idx = take({s, h, nb, z.maxk}, sizeof(int32_t));
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
                + " and 1 <= batch <= 65535, got tokens " + std::to_string(a.tokens) + ", batch "
                + std::to_string(a.batch));
            return 1;
        }
        if (!aligned(a.q) || !aligned(a.k) || !aligned(a.v) || !aligned(a.out) || !aligned(a.cuSeqlens)
            || !aligned(a.workspace))
        {
            logError("enqueue: q, k, v, cu_seqlens, out and the workspace must be 16-byte aligned");
            return 1;
        }
        CrispSizes const z = crispSizes(p, a.tokens);
        CrispWorkspaceLayout const w = crispWorkspaceLayout(p, a.batch, a.tokens);
        if (w.total == kSATURATED)
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
        int64_t const block = p.blockSize;
        int64_t const heads = p.numHeads;
        int64_t const kvHeads = p.numKvHeads;
        int64_t const seqs = a.batch;
        int64_t const minBlocks = ceilDiv(p.minBudget, block);
        bool const floor = p.budget == "floor";
        int64_t const kappas = p.coverage == 0.F || !floor ? 1 : kKAPPA_HALVINGS + 1;
        // The torch launcher's arguments (crisp_trt/kernels/pipeline.py), by kernel parameter name.
        Arg const args[] = {pointerArg("q_ptr", a.q), pointerArg("k_ptr", a.k), pointerArg("v_ptr", a.v),
            pointerArg("o_ptr", a.out), pointerArg("cu_ptr", a.cuSeqlens), pointerArg("part_m_ptr", ws + w.partM),
            pointerArg("part_l_ptr", ws + w.partL), pointerArg("vsum_ptr", ws + w.vsum),
            pointerArg("vmax_ptr", ws + w.vmax), pointerArg("ssum_ptr", ws + w.ssum), pointerArg("smax_ptr", ws + w.smax),
            pointerArg("s_ptr", ws + w.sMass), pointerArg("pq_ptr", ws + w.pooledQ), pointerArg("pk_ptr", ws + w.pooledK),
            pointerArg("keep_c_ptr", ws + w.columns), pointerArg("keep_o_ptr", ws + w.offsets),
            pointerArg("keep_d_ptr", ws + w.distances), pointerArg("cols_ptr", ws + w.cols),
            pointerArg("ncols_ptr", ws + w.ncols), pointerArg("dists_ptr", ws + w.dists),
            pointerArg("ndists_ptr", ws + w.ndists), pointerArg("cstruct_ptr", ws + w.cStruct),
            pointerArg("route_ptr", ws + w.route), pointerArg("dense_ptr", ws + w.dense),
            pointerArg("scratch_ptr", ws + w.scratch), pointerArg("idx_ptr", ws + w.idx),
            pointerArg("counts_ptr", ws + w.counts), pointerArg("cnt_ptr", ws + w.counts),
            pointerArg("flag_ptr", ws + w.poison), pointerArg("global_scratch", nullptr),
            pointerArg("profile_scratch", nullptr),
            floatArg("sm_scale", static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.headDim)))),
            floatArg("kappa", p.kappa), floatArg("quantile", p.floorQuantile), floatArg("gamma", p.gamma),
            floatArg("tau", p.tau), floatArg("coverage", p.coverage), intArg("steps", kappas), intArg("total", a.tokens), intArg("seqs", seqs), intArg("chunk", z.chunk),
            intArg("dense_below", std::max(p.denseBelow, 1)), intArg("min_blocks", minBlocks),
            intArg("max_blocks", p.maxBudget / block), intArg("H", heads), intArg("G", heads / kvHeads),
            intArg("HK", kvHeads), intArg("NB", z.nb), intArg("NQB", z.nb), intArg("NCH", z.nch),
            intArg("MAXK", z.maxk), intArg("MAXC", z.maxc), intArg("MAXD", z.maxd),
            intArg("SINK", ceilDiv(p.sinkTokens, block)), intArg("LOCAL", p.localBlocks),
            intArg("SAMPLES", p.floorSamples), intArg("q_width", heads * p.headDim),
            intArg("kv_width", kvHeads * p.headDim), intArg("width", heads * p.headDim), intArg("BLOCK", block),
            intArg("D", p.headDim), intArg("L", p.window()), intArg("C", z.routeChunk),
            intArg("FLOOR", floor), intArg("MIN_TOP", minBlocks > 0)};
        Launcher launch(args, a.bf16, stream);
        using Image = CrispKernelImage;
        auto const elements = [&](Image const& i) { return ceilDiv(a.tokens * heads * p.headDim, constexprOf(i, "ELEMS")); };
        int32_t status = launch.init();
        auto const step = [&](char const* stage, auto const& grid) {
            if (status == 0)
            {
                status = launch(stage, grid);
            }
        };
        step("estimate_partial", [&](Image const&) { return Grid{z.nch, heads, seqs}; });
        step("estimate_mass", [&](Image const&) { return Grid{z.nch, heads, seqs}; });
        step("slash_reduce", [&](Image const& i) { return Grid{ceilDiv(z.nb, constexprOf(i, "RB")), heads, seqs}; });
        step("pool", [&](Image const&) { return Grid{z.nb, heads + kvHeads, seqs}; });
        step("route", [&](Image const&) { return Grid{heads, seqs, 1}; });
        if (p.routing == "jsd")
        {
            step("route_jsd", [&](Image const&) { return Grid{heads, seqs, 1}; });
        }
        step("select", [&](Image const& i) { return Grid{ceilDiv(z.nb, constexprOf(i, "QG")), heads, seqs}; });
        step("attend", [&](Image const&) { return Grid{z.nb, heads, seqs}; });
        step("poison_scan", [&](Image const& i) { return Grid{elements(i), 3, 1}; });
        step("poison_apply", [&](Image const& i) { return Grid{elements(i), 1, 1}; });
        return status;
    }
    catch (std::exception const& e)
    {
        logError(std::string("enqueue: ") + e.what());
        return 1;
    }
}

} // namespace crisp
