#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: the CUDA backend's tests against the real device, then
# the GPU benchmarks, in one command. Writes gpu_check.md (the table for docs/perf.md).
#
#   bash scripts/gpu_check.sh [python]     (default: python3 with CuPy and CUDA PyTorch)
#
# Nothing in this script has run yet: no GPU was lent to the sessions that wrote it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-python3}"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
unset HOLOGRAM_CUDA_DEVICE  # the real device
"$PY" -c "import hologram as hg; r = hg.backend.why_unavailable('cuda'); \
  assert r is None, f'no usable GPU: {r}'; print(hg.Executor('cuda').backend.describe())"
# Every op, the composites and the random programs on the GPU (the order knobs are the
# emulator's; the harness-can-fail tests are emulator-only and skip).
HOLOGRAM_CUDA_TEST_DEVICE=gpu "$PY" -m pytest -q -p no:cacheprovider \
  tests/test_cuda_emulated.py tests/test_cuda_half.py tests/test_cuda_compile.py \
  tests/test_cuda_gpu_interop.py
"$PY" benchmarks/bench_cuda.py --json gpu_check.json --markdown gpu_check.md
echo "wrote gpu_check.md: add its table, the date and this command to docs/perf.md"
