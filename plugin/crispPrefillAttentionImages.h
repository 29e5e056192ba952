/*
 * The embedded kernels: cubins of crisp_trt/kernels/ compiled ahead of time by scripts/aot_compile.py,
 * which generates crispKernelImages() at build time (build dir, crispKernelImages.cpp).
 */
#pragma once

#include <cstddef>
#include <cstdint>

namespace crisp
{

enum class CrispParamType : int32_t
{
    kPOINTER, //!< a device pointer (Triton's hidden scratch pointers are passed null)
    kINT32,
    kFLOAT32,
};

//! One kernel parameter, in launch order; the launcher supplies its value by name.
struct CrispKernelParam
{
    char const* name;
    CrispParamType type;
};

//! A constexpr a cubin was specialised for (BLOCK, D, ...); the launcher picks the cubin whose values match.
struct CrispConstexpr
{
    char const* name;
    int64_t value;
};

struct CrispKernelImage
{
    char const* stage;  //!< pipeline stage: "attend", ...
    char const* kernel; //!< entry name in the cubin
    int32_t arch;       //!< compute capability, major * 10 + minor
    bool bf16;          //!< element type of the q/k/v/out pointers: bfloat16 if true, else float16
    CrispConstexpr const* constexprs;
    int32_t nbConstexprs;
    CrispKernelParam const* params;
    int32_t nbParams;
    int32_t numWarps;
    int32_t sharedBytes; //!< dynamic shared memory per block
    unsigned char const* cubin;
    size_t cubinSize;
};

//! The longest sequence the cubins accept (scripts/aot_compile.py --max-seqlen): it sets attend's NQB.
int64_t crispKernelMaxSeqLen() noexcept;

//! The embedded cubins (count = 0 for a build without kernels).
CrispKernelImage const* crispKernelImages(int32_t& count) noexcept;

} // namespace crisp
