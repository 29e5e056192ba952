/*
 * GPU harness for libcrisp_trt_plugin.so, loaded by tests/plugin_harness.py through ctypes (tests/test_plugin.py,
 * scripts/device/gpu_plugin.sh). It plays TensorRT's part on caller-owned CUDA buffers (torch tensors):
 *
 *   crisp_harness_create   build phase: createPlugin, getOutputDataTypes, getOutputShapes (a constant-folding
 *                          IExprBuilder), supportsFormatCombination, configurePlugin, getWorkspaceSize; then the
 *                          runtime phase as an engine does it: createPlugin(kRUNTIME) from getFieldsToSerialize,
 *                          attachToContext; allocates the workspace. With the fields chunked / return_lse the
 *                          plugin has the cu_seqlens_k input / the lse output too.
 *   crisp_harness_enqueue  onShapeChange + enqueue on the caller's stream (no synchronisation); cu_seqlens_k and
 *                          lse are read only when the plugin has them
 *   crisp_harness_destroy  frees the plugins and the workspace
 *   crisp_harness_error    the last failure, with every message the plugin logged since
 */
#include "crispPluginLoad.h"

#include <cuda_runtime_api.h>

#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

using namespace nvinfer1;

namespace
{

std::mutex gMutex;
std::string gError;

void fail(std::string const& what)
{
    std::lock_guard<std::mutex> lock(gMutex);
    gError += what + "\n";
}

struct Logger : ILogger
{
    void log(Severity severity, AsciiChar const* msg) noexcept override
    {
        if (severity <= Severity::kWARNING)
            fail(std::string(severity == Severity::kWARNING ? "warning: " : "error: ") + msg);
    }
} gLogger;

struct LoggerFinder : ILoggerFinder
{
    ILogger* findLogger() override
    {
        return &gLogger;
    }
} gLoggerFinder;

// A dimension expression: a constant, or an opaque runtime value (the token and batch axes).
class FakeExpr final : public apiv::VDimensionExpr
{
public:
    FakeExpr(bool constant, int64_t value)
        : mConstant(constant)
        , mValue(value)
    {
    }
    bool isConstant() const override
    {
        return mConstant;
    }
    int64_t getConstantValue() const override
    {
        return mConstant ? mValue : -1;
    }
    bool isSizeTensor() const override
    {
        return false;
    }

private:
    bool mConstant;
    int64_t mValue;
};

class Expr final : public IDimensionExpr
{
public:
    Expr(bool constant, int64_t value)
        : mFake(constant, value)
    {
        mImpl = &mFake;
    }
    ~Expr() noexcept override = default;

private:
    FakeExpr mFake;
};

class FakeBuilder final : public apiv::VExprBuilder
{
public:
    IDimensionExpr const* constant(int64_t value) override
    {
        return &mExprs.emplace_back(true, value);
    }
    IDimensionExpr const* operation(DimensionOperation, IDimensionExpr const&, IDimensionExpr const&) override
    {
        return &mExprs.emplace_back(false, 0); // the plugin's shapes need no arithmetic
    }
    IDimensionExpr const* declareSizeTensor(int32_t, IDimensionExpr const&, IDimensionExpr const&) override
    {
        return nullptr;
    }
    IDimensionExpr const* runtime()
    {
        return &mExprs.emplace_back(false, 0);
    }

private:
    std::deque<Expr> mExprs;
};

class ExprBuilder final : public IExprBuilder
{
public:
    ExprBuilder()
    {
        mImpl = &mFake;
    }
    ~ExprBuilder() noexcept override = default;
    FakeBuilder mFake;
};

struct Harness
{
    std::unique_ptr<IPluginV3> build;
    std::unique_ptr<IPluginV3> runtime;
    IPluginV3OneRuntime* run{nullptr};
    DataType type{};
    int64_t heads{0};
    int64_t kvHeads{0};
    int64_t headDim{0};
    bool chunked{false};
    bool lse{false};
    void* workspace{nullptr};
    ~Harness()
    {
        cudaFree(workspace);
    }
};

// [d0] (heads = 0: cu_seqlens), [d0, heads] (dim = 0: lse) or [d0, heads, dim] (q, k, v, out).
int32_t rankOf(int64_t heads, int64_t dim)
{
    return heads == 0 ? 1 : dim == 0 ? 2 : 3;
}

DynamicPluginTensorDesc dynamicDesc(DataType type, int64_t tokensMax, int64_t heads, int64_t dim)
{
    DynamicPluginTensorDesc d{};
    d.desc.type = type;
    d.desc.format = TensorFormat::kLINEAR;
    d.desc.dims.nbDims = rankOf(heads, dim);
    d.desc.dims.d[0] = -1;
    d.min = d.opt = d.max = d.desc.dims;
    d.min.d[0] = 1;
    d.opt.d[0] = d.max.d[0] = tokensMax;
    if (heads != 0)
    {
        d.desc.dims.d[1] = d.min.d[1] = d.opt.d[1] = d.max.d[1] = heads;
        d.desc.dims.d[2] = d.min.d[2] = d.opt.d[2] = d.max.d[2] = dim;
    }
    return d;
}

int32_t nbInputs(Harness const& h)
{
    return h.chunked ? 5 : 4;
}

int32_t nbOutputs(Harness const& h)
{
    return h.lse ? 2 : 1;
}

bool buildPhase(Harness& h, IPluginCreatorV3One* creator, PluginFieldCollection const& fc, int64_t maxTokens,
    int64_t maxTokensK, int64_t maxBatch)
{
    h.build.reset(creator->createPlugin("crisp", &fc, TensorRTPhase::kBUILD));
    if (h.build == nullptr)
        return fail("createPlugin(kBUILD) returned null"), false;
    auto* build = static_cast<IPluginV3OneBuild*>(h.build->getCapabilityInterface(PluginCapabilityType::kBUILD));
    int32_t const nIn = nbInputs(h);
    int32_t const nOut = nbOutputs(h);
    if (build->getNbOutputs() != nOut)
        return fail("getNbOutputs: expected " + std::to_string(nOut)), false;
    DataType const types[5] = {h.type, h.type, h.type, DataType::kINT32, DataType::kINT32};
    DataType outTypes[2]{};
    if (build->getOutputDataTypes(outTypes, nOut, types, nIn) != 0 || outTypes[0] != h.type
        || (h.lse && outTypes[1] != DataType::kFLOAT))
        return fail("getOutputDataTypes"), false;
    ExprBuilder exprs;
    DimsExprs in[5]{};
    int64_t const heads[5] = {h.heads, h.kvHeads, h.kvHeads, 0, 0};
    for (int32_t i = 0; i < nIn; ++i)
    {
        in[i].nbDims = i >= 3 ? 1 : 3;
        in[i].d[0] = i == 2 ? in[1].d[0] : exprs.mFake.runtime();
        if (i < 3)
        {
            in[i].d[1] = exprs.constant(heads[i]);
            in[i].d[2] = exprs.constant(h.headDim);
        }
    }
    DimsExprs out[2]{};
    if (build->getOutputShapes(in, nIn, nullptr, 0, out, nOut, exprs) != 0 || out[0].nbDims != 3
        || out[0].d[0] != in[0].d[0] || !out[0].d[1]->isConstant() || out[0].d[1]->getConstantValue() != h.heads
        || !out[0].d[2]->isConstant() || out[0].d[2]->getConstantValue() != h.headDim)
        return fail("getOutputShapes: expected [q.d0, num_heads, head_dim]"), false;
    if (h.lse
        && (out[1].nbDims != 2 || out[1].d[0] != in[0].d[0] || !out[1].d[1]->isConstant()
            || out[1].d[1]->getConstantValue() != h.heads))
        return fail("getOutputShapes: expected lse [q.d0, num_heads]"), false;
    std::vector<DynamicPluginTensorDesc> io = {dynamicDesc(h.type, maxTokens, h.heads, h.headDim),
        dynamicDesc(h.type, maxTokensK, h.kvHeads, h.headDim), dynamicDesc(h.type, maxTokensK, h.kvHeads, h.headDim),
        dynamicDesc(DataType::kINT32, maxBatch + 1, 0, 0)};
    if (h.chunked)
        io.push_back(dynamicDesc(DataType::kINT32, maxBatch + 1, 0, 0));
    io.push_back(dynamicDesc(h.type, maxTokens, h.heads, h.headDim));
    if (h.lse)
        io.push_back(dynamicDesc(DataType::kFLOAT, maxTokens, h.heads, 0));
    for (int32_t pos = 0; pos < nIn + nOut; ++pos)
        if (!build->supportsFormatCombination(pos, io.data(), nIn, nOut))
            return fail("supportsFormatCombination rejects position " + std::to_string(pos)), false;
    if (build->configurePlugin(io.data(), nIn, io.data() + nIn, nOut) != 0)
        return fail("configurePlugin"), false;
    size_t const bytes = build->getWorkspaceSize(io.data(), nIn, io.data() + nIn, nOut);
    cudaError_t status = cudaMalloc(&h.workspace, bytes == 0 ? 1 : bytes);
    if (status != cudaSuccess)
        return fail(std::string("cudaMalloc workspace: ") + cudaGetErrorString(status)), false;
    return true;
}

bool runtimePhase(Harness& h, IPluginCreatorV3One* creator)
{
    auto* buildRuntime
        = static_cast<IPluginV3OneRuntime*>(h.build->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    PluginFieldCollection const* serialised = buildRuntime->getFieldsToSerialize();
    std::unique_ptr<IPluginV3> deserialised(
        serialised == nullptr ? nullptr : creator->createPlugin("crisp", serialised, TensorRTPhase::kRUNTIME));
    if (deserialised == nullptr)
        return fail("createPlugin(kRUNTIME) from getFieldsToSerialize returned null"), false;
    auto* run = static_cast<IPluginV3OneRuntime*>(deserialised->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    h.runtime.reset(run->attachToContext(nullptr));
    if (h.runtime == nullptr)
        return fail("attachToContext returned null"), false;
    h.run = static_cast<IPluginV3OneRuntime*>(h.runtime->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    return true;
}

PluginTensorDesc desc(DataType type, int64_t d0, int64_t heads, int64_t dim)
{
    PluginTensorDesc d{};
    d.type = type;
    d.format = TensorFormat::kLINEAR;
    d.dims.nbDims = rankOf(heads, dim);
    d.dims.d[0] = d0;
    d.dims.d[1] = heads;
    d.dims.d[2] = dim;
    return d;
}

} // namespace

extern "C" __attribute__((visibility("default"))) void* crisp_harness_create(char const* runtime, char const* plugin,
    int32_t nbFields, char const* const* names, int32_t const* types, void const* const* data, int32_t const* lengths,
    int32_t bf16, int32_t heads, int32_t kvHeads, int32_t headDim, int32_t chunked, int32_t lse, int64_t maxTokens,
    int64_t maxTokensK, int64_t maxBatch)
{
    {
        std::lock_guard<std::mutex> lock(gMutex);
        gError.clear();
    }
    std::string error;
    IPluginCreatorV3One* creator = crisp_test::loadCreator(runtime, plugin, &gLoggerFinder, error);
    if (creator == nullptr)
        return fail(error), nullptr;
    PluginFieldType const kinds[3] = {PluginFieldType::kINT32, PluginFieldType::kFLOAT32, PluginFieldType::kCHAR};
    std::vector<PluginField> fields;
    for (int32_t i = 0; i < nbFields; ++i)
        fields.emplace_back(names[i], data[i], kinds[types[i]], lengths[i]);
    PluginFieldCollection const fc{nbFields, fields.data()};
    auto h = std::make_unique<Harness>();
    h->type = bf16 ? DataType::kBF16 : DataType::kHALF;
    h->heads = heads;
    h->kvHeads = kvHeads;
    h->headDim = headDim;
    h->chunked = chunked != 0;
    h->lse = lse != 0;
    if (!buildPhase(*h, creator, fc, maxTokens, maxTokensK, maxBatch) || !runtimePhase(*h, creator))
        return nullptr;
    return h.release();
}

extern "C" __attribute__((visibility("default"))) int32_t crisp_harness_enqueue(void* handle, int64_t tokens,
    int64_t tokensK, int64_t batch, void const* q, void const* k, void const* v, void const* cuSeqlens,
    void const* cuSeqlensK, void* out, void* lse, void* stream)
{
    auto& h = *static_cast<Harness*>(handle);
    PluginTensorDesc const in[5] = {desc(h.type, tokens, h.heads, h.headDim),
        desc(h.type, tokensK, h.kvHeads, h.headDim), desc(h.type, tokensK, h.kvHeads, h.headDim),
        desc(DataType::kINT32, batch + 1, 0, 0), desc(DataType::kINT32, batch + 1, 0, 0)};
    PluginTensorDesc const outDesc[2]
        = {desc(h.type, tokens, h.heads, h.headDim), desc(DataType::kFLOAT, tokens, h.heads, 0)};
    if (h.run->onShapeChange(in, nbInputs(h), outDesc, nbOutputs(h)) != 0)
        return fail("onShapeChange"), -1;
    void const* inputs[5] = {q, k, v, cuSeqlens, cuSeqlensK};
    void* outputs[2] = {out, lse};
    int32_t const status = h.run->enqueue(in, outDesc, inputs, outputs, h.workspace, static_cast<cudaStream_t>(stream));
    if (status != 0)
        fail("enqueue returned " + std::to_string(status));
    return status;
}

extern "C" __attribute__((visibility("default"))) void crisp_harness_destroy(void* handle)
{
    delete static_cast<Harness*>(handle);
}

extern "C" __attribute__((visibility("default"))) char const* crisp_harness_error()
{
    std::lock_guard<std::mutex> lock(gMutex);
    return gError.c_str();
}
