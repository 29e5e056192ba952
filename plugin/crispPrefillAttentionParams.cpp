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

// CrispConfig's field order, the head counts, then the optional fields (the generated CRISP_FIELDS).
struct FieldSpec
{
    char const* name;
    PluginFieldType type;
};

#define CRISP_FIELD_SPEC(name, member, type) {#name, PluginFieldType::type},
constexpr FieldSpec kFIELDS[] = {CRISP_FIELDS(CRISP_FIELD_SPEC)};
#undef CRISP_FIELD_SPEC
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
#define CRISP_FIELD_SLOT(name, member, type) &p.member,
    Slot const slots[kNB_FIELDS] = {CRISP_FIELDS(CRISP_FIELD_SLOT)};
#undef CRISP_FIELD_SLOT
    return slots[i];
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
        for (int32_t i = 0; i < kCRISP_NB_REQUIRED_FIELDS; ++i) // an optional field left out keeps its default
        {
            if (seen.count(i) == 0)
            {
                error = std::string("missing field \"") + kFIELDS[i].name + "\"";
                return false;
            }
        }
        error = crispCheckRanges(p);
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
    static_assert(kNB_FIELDS > kCRISP_NB_REQUIRED_FIELDS, "the optional fields follow the required ones");
    CrispParams const defaults;
    std::vector<PluginField> v;
    for (int32_t i = 0; i < kNB_FIELDS; ++i)
    {
        void const* data = slot(params, i);
        // An optional field (INT32 or FLOAT32, contract.OPTIONAL) at its default is left out, so a plugin made from
        // the first plugin's 18 fields serialises those 18, byte for byte.
        if (i >= kCRISP_NB_REQUIRED_FIELDS && std::memcmp(data, slot(defaults, i), sizeof(int32_t)) == 0)
        {
            continue;
        }
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
