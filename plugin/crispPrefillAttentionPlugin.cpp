#include "crispPrefillAttentionPlugin.h"
#include "crispPrefillAttentionKernels.h"
#include "crispPrefillAttentionLogging.h"

#include <algorithm>
#include <exception>
#include <limits>
#include <new>

using namespace nvinfer1;

namespace crisp
{
namespace
{
char const* const kNAME{"CrispPrefillAttention"};
char const* const kVERSION{"1"};
char const* const kNAMESPACE{"crisp"};
constexpr int32_t kMAX_INPUTS{5};
constexpr int32_t kSEQLENS{3};
constexpr int32_t kSEQLENS_K{4}; // the optional key offsets (field chunked = 1)

// q, k, v, cu_seqlens (, cu_seqlens_k) and out (, lse): the optional ones chosen by the fields.
int32_t inputsOf(CrispParams const& p)
{
    return 4 + p.chunked;
}

int32_t outputsOf(CrispParams const& p)
{
    return 1 + p.returnLse;
}

bool isHalf(DataType type)
{
    return type == DataType::kHALF || type == DataType::kBF16;
}

// Dimension `value` of a build-time (-1: dynamic) or run-time shape matches `expected`.
bool dimMatches(int64_t value, int64_t expected)
{
    return value == -1 || value == expected;
}

// q, k, v are [tokens, heads, head_dim] with the plugin's head counts (k and v: the key tokens, q's own unless
// chunked), cu_seqlens (and cu_seqlens_k) [batch + 1].
bool shapesMatch(Dims const* in, int32_t nbInputs, CrispParams const& p)
{
    if (nbInputs != inputsOf(p) || in[kSEQLENS].nbDims != 1
        || (p.chunked != 0 && (in[kSEQLENS_K].nbDims != 1 || !dimMatches(in[kSEQLENS_K].d[0], in[kSEQLENS].d[0]))))
    {
        return false;
    }
    int64_t const heads[3] = {p.numHeads, p.numKvHeads, p.numKvHeads};
    int64_t const tokens[3] = {in[0].d[0], p.chunked != 0 ? in[1].d[0] : in[0].d[0], in[1].d[0]};
    for (int32_t i = 0; i < 3; ++i)
    {
        if (in[i].nbDims != 3 || !dimMatches(in[i].d[1], heads[i]) || !dimMatches(in[i].d[2], p.headDim)
            || !dimMatches(in[i].d[0], tokens[i]))
        {
            return false;
        }
    }
    return true;
}
} // namespace

CrispPrefillAttentionPlugin::CrispPrefillAttentionPlugin(CrispParams params)
    : mParams(std::move(params))
{
}

IPluginCapability* CrispPrefillAttentionPlugin::getCapabilityInterface(PluginCapabilityType type) noexcept
{
    switch (type)
    {
    case PluginCapabilityType::kCORE: return static_cast<IPluginV3OneCore*>(this);
    case PluginCapabilityType::kBUILD: return static_cast<IPluginV3OneBuild*>(this);
    case PluginCapabilityType::kRUNTIME: return static_cast<IPluginV3OneRuntime*>(this);
    }
    return nullptr;
}

IPluginV3* CrispPrefillAttentionPlugin::clone() noexcept
{
    return new (std::nothrow) CrispPrefillAttentionPlugin(mParams);
}

char const* CrispPrefillAttentionPlugin::getPluginName() const noexcept
{
    return kNAME;
}

char const* CrispPrefillAttentionPlugin::getPluginVersion() const noexcept
{
    return kVERSION;
}

char const* CrispPrefillAttentionPlugin::getPluginNamespace() const noexcept
{
    return kNAMESPACE;
}

int32_t CrispPrefillAttentionPlugin::getNbOutputs() const noexcept
{
    return outputsOf(mParams);
}

int32_t CrispPrefillAttentionPlugin::getOutputDataTypes(
    DataType* outputTypes, int32_t nbOutputs, DataType const* inputTypes, int32_t nbInputs) const noexcept
{
    if (nbOutputs != outputsOf(mParams) || nbInputs != inputsOf(mParams) || !isHalf(inputTypes[0]))
    {
        logError("getOutputDataTypes: expected " + std::to_string(inputsOf(mParams)) + " inputs (q fp16/bf16, k, v, "
            + "cu_seqlens" + (mParams.chunked != 0 ? ", cu_seqlens_k" : "") + ") and "
            + std::to_string(outputsOf(mParams)) + " output(s)");
        return -1;
    }
    outputTypes[0] = inputTypes[0];
    if (mParams.returnLse != 0)
    {
        outputTypes[1] = DataType::kFLOAT;
    }
    return 0;
}

int32_t CrispPrefillAttentionPlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs,
    DimsExprs const* /* shapeInputs */, int32_t /* nbShapeInputs */, DimsExprs* outputs, int32_t nbOutputs,
    IExprBuilder& exprBuilder) noexcept
{
    if (nbInputs != inputsOf(mParams) || nbOutputs != outputsOf(mParams) || inputs[0].nbDims != 3)
    {
        logError("getOutputShapes: expected q [tokens, num_heads, head_dim], k, v, cu_seqlens (, cu_seqlens_k) and "
            + std::to_string(outputsOf(mParams)) + " output(s)");
        return -1;
    }
    outputs[0].nbDims = 3;
    outputs[0].d[0] = inputs[0].d[0];
    outputs[0].d[1] = exprBuilder.constant(mParams.numHeads);
    outputs[0].d[2] = exprBuilder.constant(mParams.headDim);
    if (mParams.returnLse != 0) // lse [tokens, num_heads]
    {
        outputs[1].nbDims = 2;
        outputs[1].d[0] = inputs[0].d[0];
        outputs[1].d[1] = exprBuilder.constant(mParams.numHeads);
    }
    return 0;
}

bool CrispPrefillAttentionPlugin::supportsFormatCombination(
    int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t nbOutputs) noexcept
{
    if (nbInputs != inputsOf(mParams) || nbOutputs != outputsOf(mParams) || pos < 0 || pos >= nbInputs + nbOutputs)
    {
        return false;
    }
    PluginTensorDesc const& desc = inOut[pos].desc;
    if (desc.format != TensorFormat::kLINEAR)
    {
        return false;
    }
    if (pos == kSEQLENS || (pos == kSEQLENS_K && mParams.chunked != 0))
    {
        return desc.type == DataType::kINT32;
    }
    if (pos == nbInputs + 1) // lse
    {
        return desc.type == DataType::kFLOAT;
    }
    return pos == 0 ? isHalf(desc.type) : desc.type == inOut[0].desc.type;
}

int32_t CrispPrefillAttentionPlugin::configurePlugin(
    DynamicPluginTensorDesc const* in, int32_t nbInputs, DynamicPluginTensorDesc const* /* out */,
    int32_t nbOutputs) noexcept
{
    Dims dims[kMAX_INPUTS];
    for (int32_t i = 0; i < kMAX_INPUTS && i < nbInputs; ++i)
    {
        dims[i] = in[i].desc.dims;
    }
    if (nbOutputs != outputsOf(mParams) || !shapesMatch(dims, nbInputs, mParams))
    {
        logError("configurePlugin: q/k/v must be [tokens, heads, head_dim] matching num_heads, num_kv_heads, "
                 "head_dim (k and v: q's tokens unless chunked), and cu_seqlens (, cu_seqlens_k) [batch + 1]");
        return -1;
    }
    int64_t const maxTokens = in[1].max.d[0]; // the keys: sizes follow the longest kv sequence
    int64_t const maxBatch = in[kSEQLENS].max.d[0] - 1;
    int64_t const maxIndexed = std::max(maxTokens, in[0].max.d[0]); // chunked: the queries' profile may differ
    if (maxIndexed > crispMaxTokens() || maxBatch > 65535)
    {
        logError("configurePlugin: the profile allows " + std::to_string(maxIndexed) + " tokens and "
            + std::to_string(maxBatch) + " sequences; the kernels take at most " + std::to_string(crispMaxTokens())
            + " tokens (int32 indices) and 65535 sequences (the grid's z axis)");
        return -1;
    }
    if (crispWorkspaceLayout(mParams, maxBatch, maxTokens).total == std::numeric_limits<size_t>::max())
    {
        logError("configurePlugin: the workspace for " + std::to_string(maxBatch) + " sequences of up to "
            + std::to_string(maxTokens) + " tokens overflows size_t (select's scratch is batch * heads * blocks^2 "
            + "floats)");
        return -1;
    }
    return 0;
}

size_t CrispPrefillAttentionPlugin::getWorkspaceSize(DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
    DynamicPluginTensorDesc const* /* outputs */, int32_t /* nbOutputs */) const noexcept
{
    if (nbInputs != inputsOf(mParams))
    {
        return 0;
    }
    return crispWorkspaceLayout(mParams, inputs[kSEQLENS].max.d[0] - 1, inputs[1].max.d[0]).total;
}

int32_t CrispPrefillAttentionPlugin::onShapeChange(
    PluginTensorDesc const* in, int32_t nbInputs, PluginTensorDesc const* /* out */, int32_t nbOutputs) noexcept
{
    Dims dims[kMAX_INPUTS];
    for (int32_t i = 0; i < kMAX_INPUTS && i < nbInputs; ++i)
    {
        dims[i] = in[i].dims;
    }
    if (nbOutputs != outputsOf(mParams) || !shapesMatch(dims, nbInputs, mParams))
    {
        logError("onShapeChange: input shapes do not match the plugin's fields");
        return -1;
    }
    return 0;
}

int32_t CrispPrefillAttentionPlugin::enqueue(PluginTensorDesc const* inputDesc,
    PluginTensorDesc const* /* outputDesc */, void const* const* inputs, void* const* outputs, void* workspace,
    cudaStream_t stream) noexcept
{
    CrispLaunchArgs args{};
    args.params = &mParams;
    args.bf16 = inputDesc[0].type == DataType::kBF16;
    args.tokens = inputDesc[0].dims.d[0];
    args.tokensK = inputDesc[1].dims.d[0];
    args.batch = inputDesc[kSEQLENS].dims.d[0] - 1;
    args.q = inputs[0];
    args.k = inputs[1];
    args.v = inputs[2];
    args.cuSeqlens = static_cast<int32_t const*>(inputs[kSEQLENS]);
    args.cuSeqlensK = static_cast<int32_t const*>(inputs[mParams.chunked != 0 ? kSEQLENS_K : kSEQLENS]);
    args.out = outputs[0];
    args.lse = mParams.returnLse != 0 ? static_cast<float*>(outputs[1]) : nullptr;
    args.workspace = workspace;
    return crispLaunchPrefill(args, stream);
}

IPluginV3* CrispPrefillAttentionPlugin::attachToContext(IPluginResourceContext* /* context */) noexcept
{
    return clone();
}

PluginFieldCollection const* CrispPrefillAttentionPlugin::getFieldsToSerialize() noexcept
{
    try
    {
        mFields = crispFieldsOf(mParams);
        mFieldCollection.nbFields = static_cast<int32_t>(mFields.size());
        mFieldCollection.fields = mFields.data();
        return &mFieldCollection;
    }
    catch (std::exception const& e)
    {
        logError(std::string("getFieldsToSerialize: ") + e.what());
        return nullptr;
    }
}

IPluginV3* CrispPrefillAttentionPluginCreator::createPlugin(
    char const* /* name */, PluginFieldCollection const* fc, TensorRTPhase /* phase */) noexcept
{
    CrispParams params;
    std::string error;
    if (!parseCrispFields(fc, params, error))
    {
        logError("createPlugin: " + error);
        return nullptr;
    }
    try
    {
        return new CrispPrefillAttentionPlugin(std::move(params));
    }
    catch (std::exception const& e)
    {
        logError(std::string("createPlugin: ") + e.what());
        return nullptr;
    }
}

PluginFieldCollection const* CrispPrefillAttentionPluginCreator::getFieldNames() noexcept
{
    return crispFieldNames();
}

char const* CrispPrefillAttentionPluginCreator::getPluginName() const noexcept
{
    return kNAME;
}

char const* CrispPrefillAttentionPluginCreator::getPluginVersion() const noexcept
{
    return kVERSION;
}

char const* CrispPrefillAttentionPluginCreator::getPluginNamespace() const noexcept
{
    return kNAMESPACE;
}

} // namespace crisp

// Dynamic loading: IPluginRegistry::loadLibrary, trtexec --dynamicPlugins.
extern "C" TENSORRTAPI IPluginCreatorInterface* const* getCreators(int32_t& nbCreators)
{
    static crisp::CrispPrefillAttentionPluginCreator sCreator;
    static IPluginCreatorInterface* const kCREATORS[] = {&sCreator};
    nbCreators = 1;
    return kCREATORS;
}

extern "C" TENSORRTAPI void setLoggerFinder(ILoggerFinder* finder)
{
    crisp::setLoggerFinder(finder);
}

#ifdef CRISP_TRT_STATIC_REGISTRATION
// Static registration (CMake -DCRISP_TRT_STATIC_REGISTRATION=ON): registers the creator into the process's
// registry when the library is loaded; the application links libnvinfer, which provides getPluginRegistry.
namespace
{
struct StaticRegistration
{
    StaticRegistration()
    {
        int32_t n = 0;
        getPluginRegistry()->registerCreator(*getCreators(n)[0], crisp::kNAMESPACE);
    }
} const gStaticRegistration;
} // namespace
#endif
