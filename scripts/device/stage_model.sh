#!/usr/bin/env bash
# Stage the SmolLM2 GGUF (98 MB, over the device's 64 MiB transfer limit) for scripts/device/gpu_bench.sh:
# .stage/smollm2.part.aa (52 MiB) + .part.ab, their sha256 and the gguf wheel. .stage/ is git-ignored
# locally (.git/info/exclude), so nothing travels unless a device call carries it. See gpu_bench.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.stage/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.stage/' >> .git/info/exclude; }
GGUF=$(python3 -c "from crisp_trt.models import smollm2_path; print(smollm2_path())")
mkdir -p .stage
rm -f .stage/smollm2.part.* .stage/gguf-*.whl
split -b 52M "$GGUF" .stage/smollm2.part.
(cd "$(dirname "$GGUF")" && sha256sum "$(basename "$GGUF")") > .stage/smollm2.sha256
python3 -m pip download -q --no-deps --only-binary=:all: -d .stage "gguf==$(python3 -c 'import importlib.metadata as m; print(m.version("gguf"))')"
ls -l .stage
