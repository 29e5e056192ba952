#include "crispPrefillAttentionParams.h"

#include <cmath>
#include <cstring>
#include <set>
#include <type_traits>

using nvinfer1::PluginField;
using nvinfer1::PluginFieldCollection;
using nvinfer1::PluginFieldType;

namespace crisp
{
namespace
{

// Order = CrispConfig's field order, then the head counts.
struct FieldSpec
{
    char const* name;
    PluginFieldType type;
};

constexpr FieldSpec kFIELDS[] = {
    {"block_size", PluginFieldType::kINT32},
    {"last_q", PluginFieldType::kINT32},
    {"sink_tokens", PluginFieldType::kINT32},
    {"local_blocks", PluginFieldType::kINT32},
    {"kappa", PluginFieldType::kFLOAT32},
    {"coverage", PluginFieldType::kFLOAT32},
    {"floor_quantile", PluginFieldType::kFLOAT32},
    {"tau", PluginFieldType::kFLOAT32},
    {"min_budget", PluginFieldType::kINT32},
    {"max_budget", PluginFieldType::kINT32},
    {"dense_below", PluginFieldType::kINT32},
    {"routing", PluginFieldType::kCHAR},
    {"budget", PluginFieldType::kCHAR},
    {"gamma", PluginFieldType::kFLOAT32},
    {"floor_samples", PluginFieldType::kINT32},
    {"num_heads", PluginFieldType::kINT32},
    {"num_kv_heads", PluginFieldType::kINT32},
    {"head_dim", PluginFieldType::kINT32},
};
constexpr int32_t kNB_FIELDS = sizeof(kFIELDS) / sizeof(kFIELDS[0]);
constexpr int32_t kMAX_STRING = 64;

char const* typeName(PluginFieldType type)
{
    switch (type)
    {
    case PluginFieldType::kINT32: return "INT32";
    case PluginFieldType::kFLOAT32: return "FLOAT32";
    case PluginFieldType::kCHAR: return "CHAR";
    default: return "another type";
    }
}

// Address of field i of `p` (an int32_t, float or std::string by kFIELDS[i].type); const follows `p`.
template <typename Params>
auto slot(Params& p, int32_t i)
{
    using Slot = std::conditional_t<std::is_const_v<Params>, void const*, void*>;
    Slot const slots[kNB_FIELDS] = {&p.blockSize, &p.lastQ, &p.sinkTokens, &p.localBlocks, &p.kappa,
        &p.coverage, &p.floorQuantile, &p.tau, &p.minBudget, &p.maxBudget, &p.denseBelow, &p.routing, &p.budget, &p.gamma,
        &p.floorSamples, &p.numHeads, &p.numKvHeads, &p.headDim};
    return slots[i];
}

std::string checkRanges(CrispParams const& p)
{
    auto const bad = [](char const* name, std::string const& expected) {
        return std::string(name) + ": expected " + expected;
    };
    auto const finite = [](float x) { return std::isfinite(x); };
    int32_t const lq = p.lastQ;
    if (p.blockSize != 64 && p.blockSize != 128) return bad("block_size", "64 or 128");
    if (lq != 0 && (lq < 16 || lq > p.blockSize || (lq & (lq - 1)) != 0))
        return bad("last_q", "0 (= block_size) or a power of two in [16, block_size]");
    if (p.sinkTokens < 0 || p.sinkTokens > 65536) return bad("sink_tokens", "an int in [0, 65536]");
    if (p.localBlocks < 1 || p.localBlocks > 64) return bad("local_blocks", "an int in [1, 64]");
    if (!finite(p.kappa) || p.kappa < 0.F) return bad("kappa", "a finite number >= 0");
    if (!finite(p.coverage) || p.coverage < 0.F || p.coverage > 1.F) return bad("coverage", "a number in [0, 1]");
    if (!finite(p.floorQuantile) || p.floorQuantile < 0.F || p.floorQuantile > 1.F)
        return bad("floor_quantile", "a number in [0, 1]");
    if (!finite(p.tau) || p.tau < 0.F) return bad("tau", "a finite number >= 0");
    if (p.minBudget < 0) return bad("min_budget", "an int >= 0");
    if (p.maxBudget < p.blockSize) return bad("max_budget", "an int >= block_size");
    if (p.minBudget > p.maxBudget) return bad("min_budget", "<= max_budget");
    if (p.denseBelow < 0) return bad("dense_below", "an int >= 0");
    if (p.routing != "struct" && p.routing != "jsd") return bad("routing", "\"struct\" or \"jsd\"");
    if (p.budget != "floor" && p.budget != "cumulative") return bad("budget", "\"floor\" or \"cumulative\"");
    if (!finite(p.gamma) || p.gamma <= 0.F || p.gamma > 1.F) return bad("gamma", "a number in (0, 1]");
    int32_t const fs = p.floorSamples;
    if (fs != 16 && fs != 32 && fs != 64 && fs != 128) return bad("floor_samples", "16, 32, 64 or 128");
    if (p.numHeads < 1 || p.numHeads > 1024) return bad("num_heads", "an int in [1, 1024]");
    if (p.numKvHeads < 1 || p.numKvHeads > p.numHeads || p.numHeads % p.numKvHeads != 0)
        return bad("num_kv_heads", "an int in [1, num_heads] that divides num_heads");
    if (p.headDim != 64 && p.headDim != 128 && p.headDim != 256) return bad("head_dim", "64, 128 or 256");
    return {};
}

} // namespace

PluginFieldCollection const* crispFieldNames() noexcept
{
    static std::vector<PluginField> const fields = [] {
        std::vector<PluginField> v;
        for (auto const& spec : kFIELDS)
        {
            v.emplace_back(spec.name, nullptr, spec.type, 1);
        }
        return v;
    }();
    static PluginFieldCollection const fc{kNB_FIELDS, fields.data()};
    return &fc;
}

bool parseCrispFields(PluginFieldCollection const* fc, CrispParams& out, std::string& error) noexcept
{
    try
    {
        if (fc == nullptr || fc->nbFields < 0 || (fc->nbFields > 0 && fc->fields == nullptr))
        {
            error = "the field collection is null or malformed";
            return false;
        }
        CrispParams p;
        std::set<int32_t> seen;
        for (int32_t f = 0; f < fc->nbFields; ++f)
        {
            PluginField const& field = fc->fields[f];
            if (field.name == nullptr)
            {
                error = "field #" + std::to_string(f) + " has no name";
                return false;
            }
            int32_t i = 0;
            while (i < kNB_FIELDS && std::strcmp(field.name, kFIELDS[i].name) != 0) ++i;
            std::string const name(field.name, strnlen(field.name, kMAX_STRING));
            if (i == kNB_FIELDS)
            {
                error = "unknown field \"" + name + "\"";
                return false;
            }
            if (!seen.insert(i).second)
            {
                error = name + ": given more than once";
                return false;
            }
            PluginFieldType const type = kFIELDS[i].type;
            if (field.type != type)
            {
                error = name + ": expected type " + typeName(type) + ", got " + typeName(field.type);
                return false;
            }
            bool const isString = type == PluginFieldType::kCHAR;
            if (field.data == nullptr || field.length < 1 || (!isString && field.length != 1)
                || field.length > kMAX_STRING)
            {
                error = name + ": expected " + (isString ? "1 to 64 characters" : "one value") + ", got length "
                    + std::to_string(field.length) + (field.data == nullptr ? " and no data" : "");
                return false;
            }
            if (isString)
            {
                auto const* chars = static_cast<char const*>(field.data);
                *static_cast<std::string*>(slot(p, i)) = std::string(chars, strnlen(chars, field.length));
            }
            else
            {
                std::memcpy(slot(p, i), field.data, sizeof(int32_t));
            }
        }
        for (int32_t i = 0; i < kNB_FIELDS; ++i)
        {
            if (seen.count(i) == 0)
            {
                error = std::string("missing field \"") + kFIELDS[i].name + "\"";
                return false;
            }
        }
        error = checkRanges(p);
        if (!error.empty()) return false;
        out = p;
        return true;
    }
    catch (std::exception const& e)
    {
        error = e.what();
        return false;
    }
}

std::vector<PluginField> crispFieldsOf(CrispParams const& params)
{
    std::vector<PluginField> v;
    for (int32_t i = 0; i < kNB_FIELDS; ++i)
    {
        void const* data = slot(params, i);
        int32_t length = 1;
        if (kFIELDS[i].type == PluginFieldType::kCHAR)
        {
            auto const* s = static_cast<std::string const*>(data);
            data = s->c_str();
            length = static_cast<int32_t>(s->size());
        }
        v.emplace_back(kFIELDS[i].name, data, kFIELDS[i].type, length);
    }
    return v;
}

} // namespace crisp
