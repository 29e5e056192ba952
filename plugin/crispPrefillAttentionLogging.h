/*
 * Logging through the logger TensorRT hands the library (setLoggerFinder); silent until it does.
 */
#pragma once

#include "NvInferRuntime.h"

#include <string>

namespace crisp
{

void setLoggerFinder(nvinfer1::ILoggerFinder* finder) noexcept;

//! "CrispPrefillAttention: <message>" at kERROR severity.
void logError(std::string const& message) noexcept;

//! "CrispPrefillAttention: <message>" at kWARNING severity.
void logWarning(std::string const& message) noexcept;

} // namespace crisp
