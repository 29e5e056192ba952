#!/usr/bin/env bash
# Build libcrisp_trt_plugin.so (and the CPU checker crisp_plugin_check) into build/plugin.
#   scripts/build_plugin.sh [TENSORRT_ROOT] [extra cmake arguments, e.g. -DCRISP_TRT_CUDA_ARCHITECTURES=90]
# TENSORRT_ROOT holds include/NvInferRuntime.h: an installed TensorRT (/usr for the Debian packages) or a
# checkout of github.com/NVIDIA/TensorRT; default: $TensorRT_ROOT, else third_party/TensorRT.
# BUILD_DIR overrides the build directory.
set -euo pipefail
cd "$(dirname "$0")/.."
root="${1:-${TensorRT_ROOT:-third_party/TensorRT}}"
shift $(( $# > 0 ? 1 : 0 ))
build="${BUILD_DIR:-build/plugin}"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DTensorRT_ROOT="$(realpath -m "$root")" "$@"
cmake --build "$build" -j "$(nproc)"
if [ ! -f "$build/libcrisp_trt_plugin.so" ]; then
    echo "build_plugin.sh: no TensorRT headers under $root (expected $root/include/NvInferRuntime.h);" \
         "get them with: git clone --depth 1 https://github.com/NVIDIA/TensorRT third_party/TensorRT" >&2
    exit 1
fi
echo "built $build/libcrisp_trt_plugin.so"
