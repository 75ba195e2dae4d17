#!/usr/bin/env bash
# ggml's CPU figures for the shapes of mixkv_bench's kernel benchmarks, from one sitting on the
# same machine (issue 14's closing note puts both side by side). Not part of CI.
#
# Downloads the source distribution of PyPI's llama-cpp-python (pinned below), which vendors
# llama.cpp, builds ggml's test-backend-ops from it in a scratch folder, and runs its perf mode
# on the CPU backend:
#   - MUL_MAT: a 4096 x 14336 weight (test-backend-ops' own perf case, m=4096 k=14336) times
#     n = 1, 5, 8 (and 64, added) float32 token columns, for f16, bf16, q8_0, q4_0, q4_1 (ggml
#     quantises the activations to q8 for the block types; mixkv keeps them float32);
#   - FLASH_ATTN_EXT: 32 query / 8 KV heads of 128, one query (decode) and 5 (a verify), at 8k
#     and 32k tokens, f16, bf16 and q8_0 K/V (added to the perf list in the scratch copy: ggml
#     has no fp8 cache type; its q8_0 is the nearest 8-bit one).
# test-backend-ops runs the CPU backend on std::thread::hardware_concurrency() threads: on the
# 2-core development machine that is mixkv_bench's threads:2.
#
# Usage: scripts/bench-ggml.sh [scratch-dir]   (default: a new temporary folder)
# Environment: LLAMA_CPP_PYTHON_VERSION (default below), JOBS (build jobs, default 2).
set -euo pipefail

version=${LLAMA_CPP_PYTHON_VERSION:-0.3.16}
jobs=${JOBS:-2}
scratch=${1:-$(mktemp -d -t mixkv-ggml-XXXXXX)}
mkdir -p "$scratch"
cd "$scratch"
echo "bench-ggml: llama-cpp-python $version in $scratch" >&2

sdist="llama_cpp_python-$version.tar.gz"
if [ ! -f "$sdist" ]; then
  pip download --no-deps --no-binary :all: "llama-cpp-python==$version" -d . >&2
fi
src="$scratch/llama_cpp_python-$version/vendor/llama.cpp"
if [ ! -d "$src" ]; then
  tar -xzf "$sdist"
fi
tests="$src/tests/test-backend-ops.cpp"
[ -f "$tests" ] || { echo "bench-ggml: $tests is missing from the sdist" >&2; exit 1; }

# Our shapes, added once to the perf list (marked so a rerun does not add them twice).
if ! grep -q "mixkv shapes" "$tests"; then
  anchor='    for (int kv : { 4096, 8192, 16384, }) {'
  grep -qF "$anchor" "$tests" || { echo "bench-ggml: perf list anchor not found in $tests" >&2; exit 1; }
  python3 - "$tests" "$anchor" <<'EOF'
import sys
path, anchor = sys.argv[1], sys.argv[2]
text = open(path).read()
added = '''    // mixkv shapes (scripts/bench-ggml.sh)
    for (ggml_type type_a : {GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1}) {
        test_cases.emplace_back(new test_mul_mat(type_a, GGML_TYPE_F32, 4096, 64, 14336, {1, 1}, {1, 1}));
    }
    for (int kv : { 8192, 32768, }) {
        for (int nb : { 1, 5, }) {
            for (ggml_type type_kv : {GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0}) {
                test_cases.emplace_back(new test_flash_attn_ext(128, 128, 8, {4, 1}, kv, nb, true, false, 0, 0, GGML_PREC_F32, type_kv));
            }
        }
    }
'''
open(path, 'w').write(text.replace(anchor, added + anchor, 1))
EOF
fi

cmake -S "$src" -B "$scratch/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=ON \
  -DLLAMA_CURL=OFF -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF >&2
cmake --build "$scratch/build" -j"$jobs" --target test-backend-ops >&2
bin="$scratch/build/bin/test-backend-ops"

echo "== MUL_MAT (m=4096 weight rows, k=14336, n token columns)"
"$bin" perf -b CPU -o MUL_MAT \
  -p 'type_a=(f16|bf16|q8_0|q4_0|q4_1),type_b=f32,m=4096,n=(1|5|8|64),k=14336,bs=\[1,1\],nr=\[1,1\]'
echo "== FLASH_ATTN_EXT (hs 128, 8 KV heads x 4 query heads each, nb queries)"
"$bin" perf -b CPU -o FLASH_ATTN_EXT -p 'hsk=128,hsv=128,nh=8,nr23=\[4,1\],kv=(8192|32768),nb=(1|5),'
