/*
 * CPU checker for libcrisp_trt_plugin.so, run by tests/test_plugin.py (no GPU needed).
 *
 *   crisp_plugin_check <runtime.so> <plugin.so> fields            field schema: "name TYPE" lines
 *   crisp_plugin_check <runtime.so> <plugin.so> check             creator, create, clone, build queries,
 *                                                                 round trip, malformed collections, the
 *                                                                 optional fields (chunked, return_lse, spike, rows)
 *   crisp_plugin_check <runtime.so> <plugin.so> roundtrip FILE    FILE: "name TYPE hexbytes" lines; prints
 *                                                                 getFieldsToSerialize in the same format
 *   crisp_plugin_check <runtime.so> <plugin.so> fuzz N SEED       N random/malformed collections
 *   crisp_plugin_check <runtime.so> <plugin.so> workspace FILE TOKENS BATCH
 *                                                                 getWorkspaceSize for that profile maximum
 *
 * <runtime.so> is a TensorRT runtime exporting getPluginRegistry (libnvinfer_lean.so from the
 * tensorrt-lean-cu13-libs wheel); the plugin is loaded through its IPluginRegistry::loadLibrary.
 */
#include "crispPluginLoad.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

using namespace nvinfer1;

namespace
{

int gFailures = 0;

// Collects the plugin's errors. A runtime hands the plugin its logger through setLoggerFinder, but the
// lean runtime has none without a GPU, so the checker hands over this one first (the plugin keeps the first).
struct CapturingLogger : ILogger
{
    std::vector<std::string> errors;
    void log(Severity severity, AsciiChar const* msg) noexcept override
    {
        if (severity <= Severity::kERROR) errors.emplace_back(msg);
    }
} gLogger;

struct CapturingLoggerFinder : ILoggerFinder
{
    ILogger* findLogger() override
    {
        return &gLogger;
    }
} gLoggerFinder;

void expect(bool ok, std::string const& what)
{
    if (!ok)
    {
        ++gFailures;
        std::printf("FAIL %s\n", what.c_str());
    }
}

struct Field
{
    std::string name;
    PluginFieldType type;
    std::vector<char> bytes; // at least 128 bytes of storage so a wrong length never reads past it
    int32_t length;
};

struct FieldSet
{
    std::vector<Field> fields;
    std::vector<PluginField> view;

    PluginFieldCollection const* collection()
    {
        view.clear();
        for (auto& f : fields)
        {
            // An empty name stands for a null one.
            view.emplace_back(f.name.empty() ? nullptr : f.name.c_str(), f.bytes.empty() ? nullptr : f.bytes.data(), f.type, f.length);
        }
        mFc = {static_cast<int32_t>(view.size()), view.data()};
        return &mFc;
    }

private:
    PluginFieldCollection mFc{};
};

Field makeField(std::string name, PluginFieldType type, void const* data, size_t bytes, int32_t length)
{
    Field f{std::move(name), type, std::vector<char>(std::max<size_t>(bytes, 128), 0), length};
    std::memcpy(f.bytes.data(), data, bytes);
    return f;
}

Field intField(std::string name, int32_t v)
{
    return makeField(std::move(name), PluginFieldType::kINT32, &v, 4, 1);
}

Field floatField(std::string name, float v)
{
    return makeField(std::move(name), PluginFieldType::kFLOAT32, &v, 4, 1);
}

Field charField(std::string name, std::string const& s)
{
    return makeField(std::move(name), PluginFieldType::kCHAR, s.data(), s.size(), static_cast<int32_t>(s.size()));
}

// The required fields' count; chunked, return_lse, spike and rows follow, optional.
constexpr int32_t kREQUIRED_FIELDS = 18;

// CrispConfig() defaults, GQA 32/8, d = 128: the first plugin's 18 fields.
FieldSet validFields()
{
    FieldSet s;
    s.fields = {intField("block_size", 128), intField("last_q", 0), intField("sink_tokens", 4),
        intField("local_blocks", 1), floatField("kappa", 8.F), floatField("coverage", 0.9F),
        floatField("floor_quantile", 0.5F),
        floatField("tau", 0.5F), intField("min_budget", 512), intField("max_budget", 16384),
        intField("dense_below", 1024), charField("routing", "struct"), charField("budget", "floor"),
        floatField("gamma", 0.9F), intField("floor_samples", 64), intField("num_heads", 32),
        intField("num_kv_heads", 8), intField("head_dim", 128)};
    return s;
}

std::string hex(void const* data, size_t bytes)
{
    std::string out;
    char buf[3];
    for (size_t i = 0; i < bytes; ++i)
    {
        std::snprintf(buf, sizeof(buf), "%02x", static_cast<unsigned char const*>(data)[i]);
        out += buf;
    }
    return out;
}

char const* typeName(PluginFieldType t)
{
    return t == PluginFieldType::kINT32 ? "INT32" : t == PluginFieldType::kFLOAT32 ? "FLOAT32" : "CHAR";
}

// "name TYPE hexbytes" per field: the exact serialised form.
std::string describe(PluginFieldCollection const* fc)
{
    if (fc == nullptr)
    {
        return "<null>";
    }
    std::ostringstream out;
    for (int32_t i = 0; i < fc->nbFields; ++i)
    {
        PluginField const& f = fc->fields[i];
        size_t const bytes = f.type == PluginFieldType::kCHAR ? f.length : 4 * static_cast<size_t>(f.length);
        out << f.name << ' ' << typeName(f.type) << ' ' << hex(f.data, bytes) << '\n';
    }
    return out.str();
}

struct Runtime
{
    IPluginCreatorV3One* creator{nullptr};
};

bool load(char const* runtimePath, char const* pluginPath, Runtime& rt)
{
    std::string error;
    rt.creator = crisp_test::loadCreator(runtimePath, pluginPath, &gLoggerFinder, error);
    if (rt.creator == nullptr)
    {
        std::printf("FAIL %s\n", error.c_str());
        return false;
    }
    std::printf("ok loaded %s::%s v%s\n", rt.creator->getPluginNamespace(), rt.creator->getPluginName(),
        rt.creator->getPluginVersion());
    return true;
}

using PluginPtr = std::unique_ptr<IPluginV3>;

PluginPtr create(Runtime& rt, PluginFieldCollection const* fc, TensorRTPhase phase = TensorRTPhase::kBUILD)
{
    return PluginPtr(rt.creator->createPlugin("crisp", fc, phase));
}

// Serialise, recreate in the runtime phase, serialise again: both forms must be identical to `expected`.
bool roundTrips(Runtime& rt, IPluginV3& plugin, std::string const& expected)
{
    auto* runtime = static_cast<IPluginV3OneRuntime*>(plugin.getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    PluginFieldCollection const* fields = runtime->getFieldsToSerialize();
    std::string const first = describe(fields);
    PluginPtr again = create(rt, fields, TensorRTPhase::kRUNTIME);
    if (again == nullptr)
    {
        return false;
    }
    auto* againRuntime
        = static_cast<IPluginV3OneRuntime*>(again->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    return first == expected && describe(againRuntime->getFieldsToSerialize()) == expected;
}

DynamicPluginTensorDesc tensor(DataType type, std::vector<int64_t> dims, std::vector<int64_t> maxDims)
{
    DynamicPluginTensorDesc d{};
    d.desc.type = type;
    d.desc.format = TensorFormat::kLINEAR;
    d.desc.dims.nbDims = static_cast<int32_t>(dims.size());
    d.min.nbDims = d.max.nbDims = d.opt.nbDims = d.desc.dims.nbDims;
    for (size_t i = 0; i < dims.size(); ++i)
    {
        d.desc.dims.d[i] = dims[i];
        d.min.d[i] = d.opt.d[i] = maxDims[i] == -1 ? dims[i] : 1;
        d.max.d[i] = maxDims[i] == -1 ? dims[i] : maxDims[i];
    }
    return d;
}

void checkBuildQueries(IPluginV3& plugin)
{
    auto* build = static_cast<IPluginV3OneBuild*>(plugin.getCapabilityInterface(PluginCapabilityType::kBUILD));
    auto* core = static_cast<IPluginV3OneCore*>(plugin.getCapabilityInterface(PluginCapabilityType::kCORE));
    expect(build != nullptr && core != nullptr, "capability interfaces");
    expect(std::strcmp(core->getPluginName(), "CrispPrefillAttention") == 0, "core name");
    expect(std::strcmp(core->getPluginNamespace(), "crisp") == 0, "core namespace");
    expect(build->getNbOutputs() == 1, "one output");
    int64_t const maxTokens = 131072;
    for (DataType type : {DataType::kHALF, DataType::kBF16})
    {
        DynamicPluginTensorDesc io[5] = {tensor(type, {-1, 32, 128}, {maxTokens, -1, -1}),
            tensor(type, {-1, 8, 128}, {maxTokens, -1, -1}), tensor(type, {-1, 8, 128}, {maxTokens, -1, -1}),
            tensor(DataType::kINT32, {-1}, {9}), tensor(type, {-1, 32, 128}, {maxTokens, -1, -1})};
        for (int32_t pos = 0; pos < 5; ++pos)
        {
            expect(build->supportsFormatCombination(pos, io, 4, 1), "supported format at " + std::to_string(pos));
        }
        DataType out{};
        DataType const types[4] = {type, type, type, DataType::kINT32};
        expect(build->getOutputDataTypes(&out, 1, types, 4) == 0 && out == type, "output type follows q");
        expect(build->configurePlugin(io, 4, io + 4, 1) == 0, "configurePlugin");
        size_t const ws = build->getWorkspaceSize(io, 4, io + 4, 1);
        size_t const rows = 8 * 32 * (maxTokens / 128); // batch * heads * blocks: select's scratch is rows * blocks floats
        expect(ws >= rows * (maxTokens / 128) * sizeof(float), "workspace covers select's scratch at max shape");
        io[1].desc.dims.d[1] = 7;
        expect(build->configurePlugin(io, 4, io + 4, 1) != 0, "configurePlugin rejects wrong kv heads");
    }
    DynamicPluginTensorDesc bad[5] = {tensor(DataType::kFLOAT, {-1, 32, 128}, {64, -1, -1}),
        tensor(DataType::kHALF, {-1, 8, 128}, {64, -1, -1}), tensor(DataType::kBF16, {-1, 8, 128}, {64, -1, -1}),
        tensor(DataType::kHALF, {-1}, {9}), tensor(DataType::kHALF, {-1, 32, 128}, {64, -1, -1})};
    expect(!build->supportsFormatCombination(0, bad, 4, 1), "rejects fp32 q");
    expect(!build->supportsFormatCombination(2, bad, 4, 1), "rejects v type != q type");
    expect(!build->supportsFormatCombination(3, bad, 4, 1), "rejects fp16 cu_seqlens");
    expect(!build->supportsFormatCombination(5, bad, 4, 1), "rejects pos out of range");
}

// A chunked plugin with the LSE output: q [tokens] with k, v [key tokens], cu_seqlens and cu_seqlens_k, out, lse.
void checkChunkedBuildQueries(IPluginV3& plugin)
{
    auto* build = static_cast<IPluginV3OneBuild*>(plugin.getCapabilityInterface(PluginCapabilityType::kBUILD));
    expect(build->getNbOutputs() == 2, "chunked + lse: two outputs");
    int64_t const maxQ = 8192;
    int64_t const maxK = 131072;
    DynamicPluginTensorDesc io[7] = {tensor(DataType::kBF16, {-1, 32, 128}, {maxQ, -1, -1}),
        tensor(DataType::kBF16, {-1, 8, 128}, {maxK, -1, -1}), tensor(DataType::kBF16, {-1, 8, 128}, {maxK, -1, -1}),
        tensor(DataType::kINT32, {-1}, {9}), tensor(DataType::kINT32, {-1}, {9}),
        tensor(DataType::kBF16, {-1, 32, 128}, {maxQ, -1, -1}), tensor(DataType::kFLOAT, {-1, 32}, {maxQ, -1})};
    for (int32_t pos = 0; pos < 7; ++pos)
    {
        expect(build->supportsFormatCombination(pos, io, 5, 2), "chunked: supported format at " + std::to_string(pos));
    }
    DataType outs[2]{};
    DataType const types[5] = {DataType::kBF16, DataType::kBF16, DataType::kBF16, DataType::kINT32, DataType::kINT32};
    expect(build->getOutputDataTypes(outs, 2, types, 5) == 0 && outs[0] == DataType::kBF16 && outs[1] == DataType::kFLOAT,
        "chunked: output types bf16 and f32");
    expect(build->getOutputDataTypes(outs, 1, types, 4) != 0, "chunked: 4 inputs / 1 output rejected");
    expect(build->configurePlugin(io, 5, io + 5, 2) == 0, "chunked: configurePlugin");
    size_t const rows = 8 * 32 * (maxK / 128); // the workspace follows the keys' tokens
    expect(build->getWorkspaceSize(io, 5, io + 5, 2) >= rows * (maxK / 128) * sizeof(float),
        "chunked: workspace covers select's scratch for the key tokens");
    expect(build->configurePlugin(io, 4, io + 5, 2) != 0, "chunked: configurePlugin rejects 4 inputs");
    DynamicPluginTensorDesc bad[7];
    std::copy(io, io + 7, bad);
    bad[6].desc.type = DataType::kHALF;
    expect(!build->supportsFormatCombination(6, bad, 5, 2), "rejects an fp16 lse");
    bad[4].desc.type = DataType::kHALF;
    expect(!build->supportsFormatCombination(4, bad, 5, 2), "rejects fp16 cu_seqlens_k");
    bad[2].desc.dims.d[0] = 100;
    bad[1].desc.dims.d[0] = 200;
    expect(build->configurePlugin(bad, 5, bad + 5, 2) != 0, "chunked: rejects k and v of different token counts");
    DynamicPluginTensorDesc wide[7];
    std::copy(io, io + 7, wide);
    wide[0].max.d[0] = int64_t{1} << 32; // a query profile past int32 indices, the keys' within them
    expect(build->configurePlugin(wide, 5, wide + 5, 2) != 0, "chunked: rejects a query profile past int32 tokens");
}

// The optional fields: a set without them (the first plugin's 18) and one with them at their defaults make the
// same plugin, serialising the 18; set, they round-trip as 20 fields and add an input and an output.
void checkOptionalFields(Runtime& rt, std::string const& expected)
{
    FieldSet zeros = validFields();
    zeros.fields.push_back(intField("chunked", 0));
    zeros.fields.push_back(intField("return_lse", 0));
    PluginPtr same = create(rt, zeros.collection());
    expect(same != nullptr && roundTrips(rt, *same, expected), "optional fields at 0: the 18-field plugin");
    for (auto const& [name, inputs, outputs] : {std::tuple<char const*, int32_t, int32_t>{"chunked", 5, 1},
             {"return_lse", 4, 2}, {"both", 5, 2}})
    {
        FieldSet s = validFields();
        std::string const which = name;
        if (which != "return_lse") s.fields.push_back(intField("chunked", 1));
        if (which != "chunked") s.fields.push_back(intField("return_lse", 1));
        std::string const fields = describe(s.collection());
        PluginPtr p = create(rt, s.collection());
        expect(p != nullptr && roundTrips(rt, *p, fields), which + ": creates and round-trips");
        if (p == nullptr) continue;
        auto* build = static_cast<IPluginV3OneBuild*>(p->getCapabilityInterface(PluginCapabilityType::kBUILD));
        expect(build->getNbOutputs() == outputs, which + ": " + std::to_string(outputs) + " outputs");
        DataType const types[5] = {DataType::kHALF, DataType::kHALF, DataType::kHALF, DataType::kINT32, DataType::kINT32};
        DataType outs[2]{};
        expect(build->getOutputDataTypes(outs, outputs, types, inputs) == 0, which + ": " + std::to_string(inputs) + " inputs");
        if (which == "both") checkChunkedBuildQueries(*p);
    }
}

// Each case mutates the valid set; every one must be rejected with nullptr.
std::vector<std::pair<std::string, std::function<void(FieldSet&)>>> malformedCases()
{
    std::vector<std::pair<std::string, std::function<void(FieldSet&)>>> cases;
    auto set = [](std::string name, Field f) {
        return [name, f](FieldSet& s) {
            for (auto& x : s.fields)
                if (x.name == name) x = f;
        };
    };
    for (auto const& f : validFields().fields)
    {
        std::string const n = f.name;
        cases.emplace_back("missing " + n, [n](FieldSet& s) {
            s.fields.erase(std::find_if(s.fields.begin(), s.fields.end(), [&](Field const& x) { return x.name == n; }));
        });
        cases.emplace_back("duplicate " + n, [f](FieldSet& s) { s.fields.push_back(f); });
        Field wrongType = f;
        wrongType.type = f.type == PluginFieldType::kINT32 ? PluginFieldType::kFLOAT32 : PluginFieldType::kINT32;
        cases.emplace_back("wrong type " + n, set(n, wrongType));
        Field noData = f;
        noData.bytes.clear();
        cases.emplace_back("null data " + n, set(n, noData));
        for (int32_t length : {0, -1, 2, 65})
        {
            Field wrongLength = f;
            wrongLength.length = f.type == PluginFieldType::kCHAR && length == 2 ? 1000 : length;
            cases.emplace_back("length " + std::to_string(wrongLength.length) + " " + n, set(n, wrongLength));
        }
    }
    cases.emplace_back("unknown field", [](FieldSet& s) { s.fields.push_back(intField("blocksize", 128)); });
    cases.emplace_back("null name", [](FieldSet& s) { s.fields[0].name.clear(); });
    auto const nan = std::nanf("");
    std::vector<std::pair<std::string, Field>> const ranges = {{"block_size", intField("block_size", 96)},
        {"last_q", intField("last_q", 24)}, {"last_q", intField("last_q", 256)}, {"last_q", intField("last_q", 8)},
        {"sink_tokens", intField("sink_tokens", -1)}, {"sink_tokens", intField("sink_tokens", 65537)},
        {"local_blocks", intField("local_blocks", 0)}, {"local_blocks", intField("local_blocks", 65)},
        {"kappa", floatField("kappa", -1.F)}, {"kappa", floatField("kappa", nan)},
        {"kappa", floatField("kappa", INFINITY)}, {"coverage", floatField("coverage", 1.5F)},
        {"coverage", floatField("coverage", nan)}, {"floor_quantile", floatField("floor_quantile", 1.5F)},
        {"tau", floatField("tau", -0.1F)}, {"min_budget", intField("min_budget", -1)},
        {"min_budget", intField("min_budget", 20000)}, {"max_budget", intField("max_budget", 64)},
        {"dense_below", intField("dense_below", -1)}, {"routing", charField("routing", "structs")},
        {"routing", charField("routing", "")}, {"budget", charField("budget", "cumul")},
        {"gamma", floatField("gamma", 0.F)}, {"gamma", floatField("gamma", 1.5F)},
        {"floor_samples", intField("floor_samples", 48)}, {"num_heads", intField("num_heads", 0)},
        {"num_heads", intField("num_heads", 4096)}, {"num_kv_heads", intField("num_kv_heads", 3)},
        {"num_kv_heads", intField("num_kv_heads", 64)}, {"head_dim", intField("head_dim", 96)}};
    for (auto const& r : ranges)
    {
        cases.emplace_back("out of range " + r.first, set(r.first, r.second));
    }
    // The optional fields, appended to the required ones: (out-of-range values, one of the wrong type, a valid one
    // that is then given twice).
    std::vector<std::tuple<std::vector<Field>, Field, Field>> const optional = {
        {{intField("chunked", 2), intField("chunked", -1)}, floatField("chunked", 1.F), intField("chunked", 1)},
        {{intField("return_lse", 2), intField("return_lse", -1)}, floatField("return_lse", 1.F),
            intField("return_lse", 1)},
        {{floatField("spike", 1.F), floatField("spike", -0.1F), floatField("spike", nan),
             floatField("spike", std::numeric_limits<float>::infinity())},
            intField("spike", 0), floatField("spike", 0.01F)},
        {{intField("rows", -16), intField("rows", 8), intField("rows", 48), intField("rows", 128)},
            floatField("rows", 16.F), intField("rows", 16)}};
    for (auto const& [bad, wrongType, valid] : optional)
    {
        std::string const n = valid.name;
        for (size_t i = 0; i < bad.size(); ++i)
        {
            Field const f = bad[i];
            cases.emplace_back(
                "out of range " + n + " #" + std::to_string(i), [f](FieldSet& s) { s.fields.push_back(f); });
        }
        cases.emplace_back("wrong type " + n, [wrongType](FieldSet& s) { s.fields.push_back(wrongType); });
        cases.emplace_back("duplicate " + n, [valid](FieldSet& s) {
            s.fields.push_back(valid);
            s.fields.push_back(valid);
        });
    }
    return cases;
}

int check(Runtime& rt)
{
    FieldSet valid = validFields();
    expect(static_cast<int32_t>(valid.fields.size()) == kREQUIRED_FIELDS, "the first plugin's 18 fields");
    expect(rt.creator->getFieldNames() != nullptr && rt.creator->getFieldNames()->nbFields == kREQUIRED_FIELDS + 4,
        "18 required fields + chunked, return_lse, spike, rows");
    std::string const expected = describe(valid.collection());
    PluginPtr plugin = create(rt, valid.collection());
    expect(plugin != nullptr, "create from valid fields");
    if (plugin == nullptr) return 1;
    PluginPtr copy(plugin->clone());
    expect(copy != nullptr && roundTrips(rt, *copy, expected), "clone round-trips");
    expect(roundTrips(rt, *plugin, expected), "serialisation round trip");
    checkBuildQueries(*plugin);
    auto* runtime = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    PluginPtr attached(runtime->attachToContext(nullptr));
    expect(attached != nullptr && roundTrips(rt, *attached, expected), "attachToContext round-trips");
    checkOptionalFields(rt, expected);

    FieldSet nulTerminated = validFields();
    for (auto& f : nulTerminated.fields)
        if (f.name == "routing") f = makeField("routing", PluginFieldType::kCHAR, "jsd", 4, 4);
    expect(create(rt, nulTerminated.collection()) != nullptr, "NUL-terminated string accepted");
    expect(create(rt, nullptr) == nullptr, "null collection rejected");
    PluginFieldCollection negative{-3, nullptr};
    expect(create(rt, &negative) == nullptr, "negative nbFields rejected");
    int32_t rejected = 0;
    auto const cases = malformedCases();
    for (auto const& [what, mutate] : cases)
    {
        FieldSet s = validFields();
        mutate(s);
        gLogger.errors.clear();
        PluginPtr p = create(rt, s.collection());
        expect(p == nullptr, "rejects " + what);
        bool const logged = gLogger.errors.size() == 1
            && gLogger.errors[0].find("CrispPrefillAttention: createPlugin: ") != std::string::npos;
        expect(logged, "one error logged for " + what);
        if (logged && rejected == 0) std::printf("ok logged: %s\n", gLogger.errors[0].c_str());
        rejected += p == nullptr;
    }
    std::printf("ok malformed %d/%zu rejected\n", rejected, cases.size());
    std::printf("%s %d failures\n", gFailures == 0 ? "ok" : "FAIL", gFailures);
    return gFailures == 0 ? 0 : 1;
}

int fuzz(Runtime& rt, int64_t n, uint32_t seed)
{
    std::mt19937 rng(seed);
    auto pick = [&rng](int32_t lo, int32_t hi) { return std::uniform_int_distribution<int32_t>(lo, hi)(rng); };
    FieldSet const base = validFields();
    int64_t created = 0;
    for (int64_t it = 0; it < n; ++it)
    {
        FieldSet s = base;
        int32_t const edits = pick(0, 6);
        for (int32_t e = 0; e < edits && !s.fields.empty(); ++e)
        {
            Field& f = s.fields[pick(0, static_cast<int32_t>(s.fields.size()) - 1)];
            switch (pick(0, 9))
            {
            case 0: s.fields.erase(s.fields.begin() + pick(0, static_cast<int32_t>(s.fields.size()) - 1)); break;
            case 1: s.fields.push_back(base.fields[pick(0, static_cast<int32_t>(base.fields.size()) - 1)]); break;
            case 2: f.type = static_cast<PluginFieldType>(pick(0, 12)); break;
            case 3: f.length = pick(-4, 200); break;
            case 4: f.bytes.clear(); break;
            case 5:
                for (auto& b : f.bytes) b = static_cast<char>(pick(0, 255));
                break;
            case 6: f.name = base.fields[pick(0, static_cast<int32_t>(base.fields.size()) - 1)].name + (pick(0, 3) == 0 ? "x" : ""); break;
            case 7: std::shuffle(s.fields.begin(), s.fields.end(), rng); break;
            default:
            {
                // A plausible value near an edge of its range keeps many collections valid.
                int32_t const v = std::vector<int32_t>{0, 1, 3, 16, 32, 64, 128, 256, 512, -1, 65536}[pick(0, 10)];
                float const x = std::vector<float>{0.F, 0.5F, 1.F, 1.0001F, -0.F, 1e30F, 8.F}[pick(0, 6)];
                if (f.type == PluginFieldType::kINT32) std::memcpy(f.bytes.data(), &v, 4);
                if (f.type == PluginFieldType::kFLOAT32) std::memcpy(f.bytes.data(), &x, 4);
                if (f.type == PluginFieldType::kCHAR)
                {
                    std::string const w = std::vector<std::string>{"jsd", "struct", "floor", "cumulative", "x"}[pick(0, 4)];
                    f = charField(f.name, w);
                }
            }
            }
        }
        PluginFieldCollection const* fc = s.collection();
        gLogger.errors.clear();
        PluginPtr p = create(rt, fc, pick(0, 1) ? TensorRTPhase::kBUILD : TensorRTPhase::kRUNTIME);
        expect(gLogger.errors.size() == (p == nullptr ? 1U : 0U), "fuzz: one error per rejection, none else");
        if (p != nullptr)
        {
            ++created;
            auto* runtime = static_cast<IPluginV3OneRuntime*>(p->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
            std::string const fields = describe(runtime->getFieldsToSerialize());
            PluginPtr copy(p->clone());
            expect(copy != nullptr && roundTrips(rt, *copy, fields), "fuzz: accepted collection round-trips");
        }
    }
    std::printf("%s fuzz %lld collections, %lld created, %lld rejected, %d failures\n", gFailures ? "FAIL" : "ok",
        static_cast<long long>(n), static_cast<long long>(created), static_cast<long long>(n - created), gFailures);
    return gFailures == 0 ? 0 : 1;
}

// FILE: "name TYPE hexbytes" lines (tests/test_plugin.py writes them from crisp_trt.plugin.plugin_fields).
FieldSet readFields(char const* path)
{
    std::ifstream in(path);
    FieldSet s;
    std::string name, type, hexBytes;
    while (in >> name >> type >> hexBytes)
    {
        std::vector<char> bytes;
        for (size_t i = 0; i + 1 < hexBytes.size(); i += 2)
            bytes.push_back(static_cast<char>(std::stoi(hexBytes.substr(i, 2), nullptr, 16)));
        PluginFieldType const t = type == "INT32" ? PluginFieldType::kINT32
            : type == "FLOAT32"                   ? PluginFieldType::kFLOAT32
                                                  : PluginFieldType::kCHAR;
        auto const length = static_cast<int32_t>(t == PluginFieldType::kCHAR ? bytes.size() : bytes.size() / 4);
        s.fields.push_back(makeField(name, t, bytes.data(), bytes.size(), length));
    }
    return s;
}

int roundtrip(Runtime& rt, char const* path)
{
    FieldSet s = readFields(path);
    PluginPtr p = create(rt, s.collection());
    if (p == nullptr)
    {
        std::printf("REJECTED\n");
        return 2;
    }
    auto* runtime = static_cast<IPluginV3OneRuntime*>(p->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    std::printf("%s", describe(runtime->getFieldsToSerialize()).c_str());
    return 0;
}

// Prints getWorkspaceSize for a profile of at most `tokens` tokens in `batch` sequences (after configurePlugin).
int workspace(Runtime& rt, char const* path, int64_t tokens, int64_t batch)
{
    FieldSet s = readFields(path);
    PluginPtr p = create(rt, s.collection());
    if (p == nullptr)
    {
        std::printf("REJECTED\n");
        return 2;
    }
    auto field = [&s](char const* name) {
        int32_t v = 0;
        for (auto const& f : s.fields)
            if (f.name == name) std::memcpy(&v, f.bytes.data(), 4);
        return static_cast<int64_t>(v);
    };
    int64_t const heads = field("num_heads");
    int64_t const kvHeads = field("num_kv_heads");
    int64_t const dim = field("head_dim");
    int32_t const inputs = 4 + static_cast<int32_t>(field("chunked"));
    int32_t const outputs = 1 + static_cast<int32_t>(field("return_lse"));
    // q, k, v, cu_seqlens (, cu_seqlens_k), out (, lse); queries as many as keys (the profile's maximum)
    std::vector<DynamicPluginTensorDesc> io = {tensor(DataType::kHALF, {-1, heads, dim}, {tokens, -1, -1}),
        tensor(DataType::kHALF, {-1, kvHeads, dim}, {tokens, -1, -1}),
        tensor(DataType::kHALF, {-1, kvHeads, dim}, {tokens, -1, -1}), tensor(DataType::kINT32, {-1}, {batch + 1})};
    if (inputs == 5) io.push_back(tensor(DataType::kINT32, {-1}, {batch + 1}));
    io.push_back(tensor(DataType::kHALF, {-1, heads, dim}, {tokens, -1, -1}));
    if (outputs == 2) io.push_back(tensor(DataType::kFLOAT, {-1, heads}, {tokens, -1}));
    auto* build = static_cast<IPluginV3OneBuild*>(p->getCapabilityInterface(PluginCapabilityType::kBUILD));
    if (build->configurePlugin(io.data(), inputs, io.data() + inputs, outputs) != 0)
    {
        std::printf("REJECTED configurePlugin\n");
        return 2;
    }
    std::printf("workspace %zu\n", build->getWorkspaceSize(io.data(), inputs, io.data() + inputs, outputs));
    return 0;
}

} // namespace

int main(int argc, char** argv)
{
    Runtime rt;
    if (argc < 4 || !load(argv[1], argv[2], rt))
    {
        std::printf("usage: %s <runtime.so> <plugin.so> fields|check|roundtrip FILE|fuzz N SEED|workspace FILE TOKENS "
                    "BATCH\n",
            argv[0]);
        return 2;
    }
    std::string const command = argv[3];
    if (command == "fields")
    {
        PluginFieldCollection const* fc = rt.creator->getFieldNames();
        for (int32_t i = 0; i < fc->nbFields; ++i)
            std::printf("%s %s\n", fc->fields[i].name, typeName(fc->fields[i].type));
        return 0;
    }
    if (command == "check") return check(rt);
    if (command == "roundtrip" && argc == 5) return roundtrip(rt, argv[4]);
    if (command == "fuzz" && argc == 6) return fuzz(rt, std::atoll(argv[4]), static_cast<uint32_t>(std::atoll(argv[5])));
    if (command == "workspace" && argc == 7) return workspace(rt, argv[4], std::atoll(argv[5]), std::atoll(argv[6]));
    std::printf("unknown command %s\n", command.c_str());
    return 2;
}
