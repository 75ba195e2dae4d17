#!/usr/bin/env bash
# llama.cpp's plain decode tokens/s on SmolLM2's GGUF over bench-generate's prompt set
# (scripts/bench_llamacpp_generate.py), for side-by-side figures with `mixkv bench-generate`.
# Not run by CI. LLAMACPP_PYTHON: a Python that imports llama_cpp (an existing virtual
# environment's bin/python); without it, PyPI's llama-cpp-python (pinned in scripts/llamacpp-venv.sh, built from source:
# slow, minutes) is installed into a throwaway virtual environment, deleted afterwards.
#   usage: [LLAMACPP_PYTHON=venv/bin/python] scripts/bench-llamacpp-generate.sh [MODEL.gguf] [ARGS...]
#   ARGS go to the Python script: --threads N (2), --max-tokens N (128), --runs N (3), --json
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/scripts/llamacpp-venv.sh"
models=${MIXKV_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/mixkv/models}
model=$models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then model=$1; shift; fi
[ -f "$model" ] || { echo "mixkv: $model is missing; run 'make deps' first" >&2; exit 1; }
# OpenMP workers that spin while they wait take the cores from each other on a shared machine
# (2 threads measured at 0.4-10 tokens/s under load, against 15 with passive waits); on an idle
# machine passive waits cost 10x instead (20 against 218-231 tokens/s): set
# OMP_WAIT_POLICY=active there.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
python=${LLAMACPP_PYTHON:-}
if [ -z "$python" ]; then
  venv=$(mktemp -d "${TMPDIR:-/tmp}/mixkv-llamacpp.XXXXXX")
  trap 'rm -rf "$venv"' EXIT
  llamacpp_venv "$venv" jinja2
  python=$venv/bin/python
fi
"$python" -c "import llama_cpp, jinja2" || { echo "mixkv: $python cannot import llama_cpp and jinja2" >&2; exit 1; }
"$python" "$here/scripts/bench_llamacpp_generate.py" --model "$model" "$@"
