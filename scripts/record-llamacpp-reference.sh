#!/usr/bin/env bash
# Records llama.cpp's behaviour on SmolLM2-135M-Instruct (the file `make deps` fetches) into
# tests/tokenizer/data/smollm2-llamacpp-reference.json, the reference mixkv's tokenizer and runner
# tests compare against. Installs PyPI's llama-cpp-python (pinned in scripts/llamacpp-venv.sh; it builds llama.cpp from
# source with this machine's compiler: slow, minutes) into a throwaway virtual environment that is
# deleted afterwards. Not run by CI: CI only reads the committed JSON.
#   usage: scripts/record-llamacpp-reference.sh [MODEL.gguf] [OUT.json]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/scripts/llamacpp-venv.sh"
models=${MIXKV_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/mixkv/models}
model=${1:-$models/SmolLM2-135M-Instruct.Q4_1.gguf}
out=${2:-$here/tests/tokenizer/data/smollm2-llamacpp-reference.json}
threads=${THREADS:-1}  # one thread: deterministic and unaffected by a busy machine

[ -f "$model" ] || { echo "mixkv: $model is missing; run 'make deps' first" >&2; exit 1; }
venv=$(mktemp -d "${TMPDIR:-/tmp}/mixkv-llamacpp.XXXXXX")
trap 'rm -rf "$venv"' EXIT
LLAMACPP_BUILD_JOBS=$threads llamacpp_venv "$venv"
"$venv/bin/python" "$here/scripts/record_llamacpp_reference.py" \
  --model "$model" --out "$out" --threads "$threads" --llama-cpp-python "$LLAMACPP_PYTHON_VERSION"
echo "mixkv: wrote $out"
