/*
 * How the checker and the GPU harness obtain the plugin's creator: through a TensorRT runtime's plugin
 * registry (IPluginRegistry::loadLibrary, e.g. libnvinfer_lean.so of the tensorrt-lean-cu13-libs wheel), or,
 * where no runtime is at hand (runtimePath empty), through the library's own getCreators, the entry point
 * loadLibrary calls.
 */
#pragma once

#include "NvInferRuntime.h"

#include <cstring>
#include <dlfcn.h>
#include <string>

namespace crisp_test
{

//! Hand the plugin library `finder` (setLoggerFinder), load it and return its V3One creator
//! CrispPrefillAttention/1/crisp; nullptr with `error` set on failure.
inline nvinfer1::IPluginCreatorV3One* loadCreator(
    char const* runtimePath, char const* pluginPath, nvinfer1::ILoggerFinder* finder, std::string& error)
{
    using namespace nvinfer1;
    void* pluginLib = dlopen(pluginPath, RTLD_NOW | RTLD_LOCAL);
    if (pluginLib == nullptr)
    {
        error = std::string("dlopen ") + pluginPath + ": " + dlerror();
        return nullptr;
    }
    using SetLoggerFinder = void (*)(ILoggerFinder*);
    auto setFinder = reinterpret_cast<SetLoggerFinder>(dlsym(pluginLib, "setLoggerFinder"));
    if (setFinder == nullptr)
    {
        error = std::string(pluginPath) + " exports no setLoggerFinder";
        return nullptr;
    }
    setFinder(finder);
    IPluginCreatorInterface* found = nullptr;
    if (runtimePath == nullptr || *runtimePath == '\0')
    {
        using GetCreators = IPluginCreatorInterface* const* (*) (int32_t&);
        auto getCreators = reinterpret_cast<GetCreators>(dlsym(pluginLib, "getCreators"));
        int32_t n = 0;
        IPluginCreatorInterface* const* creators = getCreators == nullptr ? nullptr : getCreators(n);
        found = n == 1 && creators != nullptr ? creators[0] : nullptr;
    }
    else
    {
        void* lib = dlopen(runtimePath, RTLD_NOW | RTLD_LOCAL);
        using GetRegistry = IPluginRegistry* (*) ();
        auto getRegistry = lib == nullptr ? nullptr : reinterpret_cast<GetRegistry>(dlsym(lib, "getPluginRegistry"));
        IPluginRegistry* registry = getRegistry == nullptr ? nullptr : getRegistry();
        // A runtime made with the caller's logger routes the registry's own messages there (the reason a load
        // fails); where none can be made (no GPU for the lean runtime) the registry still works, silently.
        using CreateRuntime = void* (*) (void*, int32_t);
        auto createRuntime
            = lib == nullptr ? nullptr : reinterpret_cast<CreateRuntime>(dlsym(lib, "createInferRuntime_INTERNAL"));
        static void* sRuntime = createRuntime == nullptr ? nullptr : createRuntime(finder->findLogger(), NV_TENSORRT_VERSION);
        (void) sRuntime;
        // The registry keeps a library once loaded: a process loads it once and looks the creator up after.
        static bool sLoaded = registry != nullptr && registry->loadLibrary(pluginPath) != nullptr;
        if (!sLoaded)
        {
            error = std::string("loadLibrary ") + pluginPath + " through " + runtimePath
                + (lib == nullptr ? std::string(": ") + dlerror() : std::string());
            return nullptr;
        }
        found = registry->getCreator("CrispPrefillAttention", "1", "crisp");
    }
    if (found == nullptr || std::strcmp(found->getInterfaceInfo().kind, "PLUGIN CREATOR_V3ONE") != 0)
    {
        error = "no V3One creator CrispPrefillAttention/1 in namespace crisp";
        return nullptr;
    }
    return static_cast<IPluginCreatorV3One*>(found);
}

} // namespace crisp_test
