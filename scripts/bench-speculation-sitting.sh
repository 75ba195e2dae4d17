#!/usr/bin/env bash
# Issue 15's figures in one sitting, for a closing note: rounds of `mixkv bench-generate` on
# SmolLM2 (the oracle and prompt lookup over the built-in prompts, prompt lookup over the held-out
# ones), each beside llama.cpp's plain decode (scripts/bench-llamacpp-generate.sh), then pairs of
# batch 1 and batch 16 on the poem prompt, plain only. scripts/speculation_sitting.py prints the
# table, each round marked with where the host put the two threads (bench-generate's
# `thread_round_trip_ns`: tens of ns near, hundreds far; docs/engine.md, "Twelfth pass"). Not run
# by CI: about a minute a round and 15 s a pair on a 2-core Zen 4.
#   usage: [LLAMACPP_PYTHON=venv/bin/python] scripts/bench-speculation-sitting.sh
#            [--rounds N (3)] [--pairs N (5)] [--runs N (3): bench-generate's runs per
#            configuration, llama.cpp's too] [--out DIR (a new temporary folder)]
#   Without LLAMACPP_PYTHON the llama.cpp columns stay empty (scripts/llamacpp-venv.sh makes one;
#   building llama-cpp-python takes minutes). MIXKV: the binary (build/mixkv).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
mixkv=${MIXKV:-$here/build/mixkv}
rounds=3 pairs=5 runs=3 out=
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --pairs) pairs=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "mixkv: unknown argument '$1' (--rounds N, --pairs N, --runs N, --out DIR)" >&2; exit 2 ;;
  esac
done
for n in "$rounds" "$pairs" "$runs"; do
  case $n in '' | *[!0-9]* | 0) echo "mixkv: --rounds, --pairs and --runs take a count >= 1" >&2; exit 2 ;; esac
done
[ -x "$mixkv" ] || { echo "mixkv: $mixkv is missing; run 'make build' first" >&2; exit 1; }
out=${out:-$(mktemp -d "${TMPDIR:-/tmp}/mixkv-sitting.XXXXXX")}
mkdir -p "$out"
bench=("$mixkv" bench-generate smollm2-135m --threads 2 --max-tokens 64 --runs "$runs" --json)
echo "sitting: $rounds rounds, $pairs batch pairs, $runs runs each; files in $out" >&2
for r in $(seq 1 "$rounds"); do
  echo "round $r of $rounds: bench-generate (built-in, held-out)$([ -n "${LLAMACPP_PYTHON:-}" ] && echo ', llama.cpp')" >&2
  "${bench[@]}" --draft oracle,ngram > "$out/builtin_$r.json"
  "${bench[@]}" --draft ngram --prompts "$here/bench/generate-prompts-heldout.jsonl" \
    > "$out/heldout_$r.json"
  if [ -n "${LLAMACPP_PYTHON:-}" ]; then
    # Active waits on an idle machine (scripts/bench-llamacpp-generate.sh says why).
    OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-active} "$here/scripts/bench-llamacpp-generate.sh" \
      --threads 2 --max-tokens 64 --runs "$runs" --json > "$out/llamacpp_$r.json"
  fi
done
grep '"name": "poem"' "$here/bench/generate-prompts.jsonl" > "$out/poem.jsonl"
for i in $(seq 1 "$pairs"); do
  echo "batch pair $i of $pairs" >&2
  for b in 1 16; do
    "${bench[@]}" --draft none --prompts "$out/poem.jsonl" --batch "$b" > "$out/batch${b}_$i.json"
  done
done
python3 "$here/scripts/speculation_sitting.py" "$out"
