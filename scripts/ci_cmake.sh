#!/usr/bin/env bash
# CI: configure the native targets with cmake; build the plugin where TensorRT headers are found
# ($TensorRT_ROOT), else say it was skipped. Exits 0 when the plugin is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cmake >/dev/null; then
    echo "CI: cmake not installed: the TensorRT plugin was skipped"
    exit 0
fi
build="${BUILD_DIR:-build/ci}"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release ${TensorRT_ROOT:+-DTensorRT_ROOT="$TensorRT_ROOT"} | grep "crisp-trt"
cmake --build "$build" -j "$(nproc)"
if [ -f "$build/libcrisp_trt_plugin.so" ]; then
    echo "CI: built the TensorRT plugin $build/libcrisp_trt_plugin.so"
else
    echo "CI: the TensorRT plugin was skipped (TensorRT headers not found; set TensorRT_ROOT to build it)"
fi
