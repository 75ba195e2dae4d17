#!/usr/bin/env bash
# Records llama.cpp's behaviour on SmolLM2-135M-Instruct (the file `make deps` fetches) into
# tests/tokenizer/data/smollm2-llamacpp-reference.json, the reference mixkv's tokenizer and runner
# tests compare against. Installs PyPI's llama-cpp-python (pinned below; it builds llama.cpp from
# source with this machine's compiler: slow, minutes) into a throwaway virtual environment that is
# deleted afterwards. Not run by CI: CI only reads the committed JSON.
#   usage: scripts/record-llamacpp-reference.sh [MODEL.gguf] [OUT.json]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
version=0.3.16
models=${MIXKV_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/mixkv/models}
model=${1:-$models/SmolLM2-135M-Instruct.Q4_1.gguf}
out=${2:-$here/tests/tokenizer/data/smollm2-llamacpp-reference.json}
threads=${THREADS:-1}  # one thread: deterministic and unaffected by a busy machine
python=${PYTHON:-python3}

[ -f "$model" ] || { echo "mixkv: $model is missing; run 'make deps' first" >&2; exit 1; }
venv=$(mktemp -d "${TMPDIR:-/tmp}/mixkv-llamacpp.XXXXXX")
trap 'rm -rf "$venv"' EXIT
"$python" -m venv "$venv"
# CPU build only, without the multimodal library and llama.cpp's own tests and examples. AVX2 and
# AVX-512 but not AMX: with GGML_NATIVE on an AMX machine, batched matrix products take ggml's
# AMX path and their logits moved by up to 30 from one-token decoding's (docs/tokenizer.md).
CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
  -DGGML_AVX512=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
  -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
  CMAKE_BUILD_PARALLEL_LEVEL=$threads \
  "$venv/bin/pip" install --quiet --no-cache-dir "llama-cpp-python==$version"
"$venv/bin/python" "$here/scripts/record_llamacpp_reference.py" \
  --model "$model" --out "$out" --threads "$threads" --llama-cpp-python "$version"
echo "mixkv: wrote $out"
