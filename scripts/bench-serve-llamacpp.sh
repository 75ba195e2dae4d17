#!/usr/bin/env bash
# Serving figures side by side from one sitting (issue 16's closing note): `mixkv serve` without
# and with a drafter, and llama.cpp's own server (PyPI's llama-cpp-python, `python -m
# llama_cpp.server`, which runs one request at a time: --interrupt_requests False queues the
# others instead of cutting their streams) on the same GGUF and the same number of threads. Each
# server in turn runs alone on the machine; scripts/bench_serve.py drives it at 1, 8 and 32
# streaming clients and prints one JSON line per client count (tokens/s, TTFT and inter-token
# latency p50/p99, failed requests).
# Not part of CI.
#
# Usage: scripts/bench-serve-llamacpp.sh [BUILD_DIR]   (default: build)
# Environment:
#   LLAMACPP_PYTHON  a Python that imports llama_cpp.server (an existing virtual environment's
#                    bin/python; saves the 15+ minute build); without it one is made in a
#                    temporary folder and deleted
#   THREADS (2), CLIENTS ("1 8 32"), SECONDS_PER_LEVEL (20), MAX_TOKENS (64), DRAFT (ngram)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
. "$here/scripts/llamacpp-venv.sh"
build=${1:-$here/build}
threads=${THREADS:-2}
clients=${CLIENTS:-1 8 32}
seconds=${SECONDS_PER_LEVEL:-20}
max_tokens=${MAX_TOKENS:-64}
draft=${DRAFT:-ngram}
python=${PYTHON:-python3}
models=${MIXKV_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/mixkv/models}
gguf=$models/SmolLM2-135M-Instruct.Q4_1.gguf

[ -x "$build/mixkv" ] || { echo "bench-serve: $build/mixkv is missing; run 'make build'" >&2; exit 1; }
[ -f "$gguf" ] || { echo "bench-serve: $gguf is missing; run 'make deps'" >&2; exit 1; }

# OpenMP workers that spin while they wait take the cores from each other on a shared machine.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
llama_python=${LLAMACPP_PYTHON:-}
venv=
if [ -z "$llama_python" ]; then
  venv=$(mktemp -d "${TMPDIR:-/tmp}/mixkv-llamacpp.XXXXXX")
  trap 'rm -rf "$venv"' EXIT
  llamacpp_venv "$venv" "llama-cpp-python[server]==$LLAMACPP_PYTHON_VERSION"
  llama_python=$venv/bin/python
fi
"$llama_python" -c "import llama_cpp.server.app" ||
  { echo "bench-serve: $llama_python cannot import llama_cpp.server" >&2; exit 1; }

bench() { "$python" "$here/scripts/bench_serve.py" "$@" --clients $clients --seconds "$seconds" \
  --max-tokens "$max_tokens"; }

echo "# load before: $(uptime)"
echo "# mixkv serve smollm2-135m, plain, --threads $threads"
bench "$build/mixkv" smollm2-135m --threads "$threads" | sed 's/^/mixkv-plain /'
echo "# mixkv serve smollm2-135m --draft $draft, --threads $threads"
bench "$build/mixkv" smollm2-135m --threads "$threads" --draft "$draft" | sed "s/^/mixkv-$draft /"

port=$("$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
echo "# llama.cpp server (llama-cpp-python $LLAMACPP_PYTHON_VERSION) on $gguf, --n_threads $threads"
"$llama_python" -m llama_cpp.server --model "$gguf" --n_threads "$threads" \
  --n_threads_batch "$threads" --n_ctx 2048 --interrupt_requests False --host 127.0.0.1 \
  --port "$port" >/dev/null 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; [ -z "$venv" ] || rm -rf "$venv"' EXIT
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null && break
  kill -0 $server 2>/dev/null || { echo "bench-serve: llama.cpp's server exited" >&2; exit 1; }
  sleep 0.5
done
bench --url "http://127.0.0.1:$port" | sed 's/^/llama.cpp /'
echo "# load after: $(uptime)"
