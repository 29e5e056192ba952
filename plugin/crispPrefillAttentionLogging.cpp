#include "crispPrefillAttentionLogging.h"

#include <mutex>

namespace crisp
{
namespace
{
std::mutex gMutex;
nvinfer1::ILoggerFinder* gFinder{nullptr};

void log(nvinfer1::ILogger::Severity severity, std::string const& message) noexcept
{
    try
    {
        std::lock_guard<std::mutex> lock(gMutex);
        nvinfer1::ILogger* logger = gFinder == nullptr ? nullptr : gFinder->findLogger();
        if (logger != nullptr)
        {
            logger->log(severity, ("CrispPrefillAttention: " + message).c_str());
        }
    }
    catch (...)
    {
    }
}
} // namespace

void setLoggerFinder(nvinfer1::ILoggerFinder* finder) noexcept
{
    std::lock_guard<std::mutex> lock(gMutex);
    if (gFinder == nullptr)
    {
        gFinder = finder;
    }
}

void logError(std::string const& message) noexcept
{
    log(nvinfer1::ILogger::Severity::kERROR, message);
}

void logWarning(std::string const& message) noexcept
{
    log(nvinfer1::ILogger::Severity::kWARNING, message);
}

} // namespace crisp
