/*
 * The plugin's fields (CrispConfig's knobs + head counts): parsing, validation and serialisation. CrispParams,
 * the field table (CRISP_FIELDS) and the range checks are generated from crisp_trt/kernels/contract.py into
 * crispPrefillAttentionContract.h; crisp_trt/plugin.py builds the fields on the Python side.
 */
#pragma once

#include "NvInferRuntime.h"
#include "crispPrefillAttentionContract.h"

#include <cstdint>
#include <string>
#include <vector>

namespace crisp
{

//! The creator's field schema: one entry per field, each of length 1 (strings: their length); the first
//! kCRISP_NB_REQUIRED_FIELDS are required, the optional ones (chunked, return_lse) default to 0.
nvinfer1::PluginFieldCollection const* crispFieldNames() noexcept;

//! Parse and validate a field collection. On failure returns false and sets `error` to one line naming the
//! field and what was expected; never reads past a field's declared length.
bool parseCrispFields(nvinfer1::PluginFieldCollection const* fc, CrispParams& out, std::string& error) noexcept;

//! Fields describing `params` (optional fields only where they differ from their defaults); the PluginField data
//! points into `params`, which must outlive their use.
std::vector<nvinfer1::PluginField> crispFieldsOf(CrispParams const& params);

} // namespace crisp
