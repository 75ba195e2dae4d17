# Sourced by the scripts that compare with llama.cpp (record-llamacpp-reference.sh,
# bench-llamacpp-generate.sh, bench-serve-llamacpp.sh): one definition of how llama.cpp is
# built for them. Not run by CI.
#
# llamacpp_venv DIR [PACKAGE...]: a virtual environment in DIR with PyPI's llama-cpp-python
# (pinned here; it builds llama.cpp from source with this machine's compiler: slow, minutes) and
# the extra packages named. CPU only, AVX2 and AVX-512 but not AMX: with GGML_NATIVE on an AMX
# machine, batched matrix products take ggml's AMX path and their logits moved by up to 30 from
# one-token decoding's (docs/tokenizer.md). AVX-512 only where the CPU has it: with
# GGML_NATIVE off the flags are compiled in unconditionally, and an AVX2-only CPU (Zen 3) stops
# on the first AVX-512 instruction. LLAMACPP_BUILD_JOBS sets the build's parallelism.
LLAMACPP_PYTHON_VERSION=0.3.16

llamacpp_venv() {
  local dir=$1
  shift
  local avx512=OFF
  grep -qw avx512f /proc/cpuinfo 2>/dev/null && avx512=ON
  "${PYTHON:-python3}" -m venv "$dir"
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
    -DGGML_AVX512=$avx512 -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
    -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
    CMAKE_BUILD_PARALLEL_LEVEL=${LLAMACPP_BUILD_JOBS:-2} \
    "$dir/bin/python" -m pip install --quiet --no-cache-dir \
    "llama-cpp-python==$LLAMACPP_PYTHON_VERSION" "$@"
}
