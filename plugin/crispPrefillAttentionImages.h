/*
 * The embedded kernels: cubins of crisp_trt/kernels/ compiled ahead of time by crisp_trt/kernels/aot.py,
 * which generates crispKernelImages() at build time (build dir, crispKernelImages.cpp).
 */
#pragma once

#include <cstddef>
#include <cstdint>

namespace crisp
{

enum class CrispParamType : int32_t
{
    kPOINTER, //!< a device pointer (Triton's hidden scratch pointers: the workspace's descriptors buffer or null)
    kINT32,
    kFLOAT32,
};

//! One kernel parameter, in launch order; the launcher supplies its value by name.
struct CrispKernelParam
{
    char const* name;
    CrispParamType type;
};

//! Element type of a cubin's q/k/v/out pointers; kANY for a kernel without them.
enum class CrispDtype : int32_t
{
    kANY,
    kFP16,
    kBF16,
};

//! A constexpr a cubin was specialised for. The launcher picks the cubin whose variant constexprs (BLOCK, D, L,
//! C, FLOOR, MIN_TOP) equal its launch arguments of the same name; fixed ones (QG, RB, ...) size its grids.
struct CrispConstexpr
{
    char const* name;
    int64_t value;
    bool variant;
};

struct CrispKernelImage
{
    char const* stage;  //!< pipeline stage: "attend", ...
    char const* kernel; //!< entry name in the cubin
    int32_t arch;       //!< compute capability, major * 10 + minor
    CrispDtype dtype;
    CrispConstexpr const* constexprs;
    int32_t nbConstexprs;
    CrispKernelParam const* params;
    int32_t nbParams;
    int32_t numWarps;
    int32_t sharedBytes; //!< dynamic shared memory per block
    unsigned char const* cubin;
    size_t cubinSize;
};

//! The embedded cubins (count = 0 for a build without kernels).
CrispKernelImage const* crispKernelImages(int32_t& count) noexcept;

} // namespace crisp
