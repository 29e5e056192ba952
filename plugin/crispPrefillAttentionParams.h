/*
 * CrispParams: the plugin's fields (CrispConfig's knobs + head counts), their schema and validation.
 * Field names, types and ranges mirror crisp_trt/config.py exactly; crisp_trt/plugin.py builds them.
 */
#pragma once

#include "NvInferRuntime.h"

#include <cstdint>
#include <string>
#include <vector>

namespace crisp
{

struct CrispParams
{
    int32_t blockSize{128};
    int32_t lastQ{0};
    int32_t sinkTokens{4};
    int32_t localBlocks{1};
    float kappa{8.F};
    float coverage{0.999F};
    float floorQuantile{0.5F};
    float tau{0.5F};
    int32_t minBudget{512};
    int32_t maxBudget{16384};
    int32_t denseBelow{1024};
    std::string routing{"struct"};
    std::string budget{"floor"};
    float gamma{0.9F};
    int32_t floorSamples{64};
    int32_t numHeads{0};
    int32_t numKvHeads{0};
    int32_t headDim{0};

    //! Rows L of the proxy map (last_q, 0 meaning block_size).
    int32_t window() const noexcept
    {
        return lastQ == 0 ? blockSize : lastQ;
    }
};

//! The creator's field schema: one entry per field, all required, each of length 1 (strings: their length).
nvinfer1::PluginFieldCollection const* crispFieldNames() noexcept;

//! Parse and validate a field collection. On failure returns false and sets `error` to one line naming the
//! field and what was expected; never reads past a field's declared length.
bool parseCrispFields(nvinfer1::PluginFieldCollection const* fc, CrispParams& out, std::string& error) noexcept;

//! Fields describing `params`; the PluginField data points into `params`, which must outlive their use.
std::vector<nvinfer1::PluginField> crispFieldsOf(CrispParams const& params);

} // namespace crisp
