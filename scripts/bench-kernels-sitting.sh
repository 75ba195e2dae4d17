#!/usr/bin/env bash
# Issue 14's points in one sitting: rounds of `mixkv_bench` over the benchmarks its acceptance
# names (the streaming read, paged (NHD and HND pages) and contiguous decode at 8k and 32k, 1 and 5
# verify rows, 1 and 8 rows of bf16, q8_0 and q4_1 weights in both orders, all on 2 threads, and
# the cache-line round trip that says where the host put the threads), then
# scripts/kernels_sitting.py prints each point as a ratio within its round, the median over rounds
# and whether it meets the issue. On a
# host whose bandwidth moves from minute to minute, only ratios taken in the same round compare.
# Not run by CI: about a minute a round on a 2-core Zen 5.
#   usage: scripts/bench-kernels-sitting.sh [--rounds N (3)] [--min-time S (0.3): seconds each
#            benchmark runs] [--out DIR (a new temporary folder)]
#   MIXKV_BENCH: the benchmark binary (build/bench/mixkv_bench).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bench=${MIXKV_BENCH:-$here/build/bench/mixkv_bench}
rounds=3 min_time=0.3 out=
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --min-time) min_time=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "mixkv: unknown argument '$1' (--rounds N, --min-time S, --out DIR)" >&2; exit 2 ;;
  esac
done
case $rounds in '' | *[!0-9]* | 0) echo "mixkv: --rounds takes a count >= 1" >&2; exit 2 ;; esac
case $min_time in '' | *[!0-9.]* | *.*.*) echo "mixkv: --min-time takes seconds, e.g. 0.3" >&2; exit 2 ;; esac
[ -x "$bench" ] || { echo "mixkv: $bench is missing; run 'make build' first" >&2; exit 1; }
out=${out:-$(mktemp -d "${TMPDIR:-/tmp}/mixkv-kernels.XXXXXX")}
mkdir -p "$out"
# Each group runs in an invocation of its own beside a streaming read and a round trip, so that a
# point's yardstick is seconds from it, not a minute.
groups=(
  'BM_Decode/(paged|paged_hnd|contiguous)/bfloat16/ctx:8192/threads:2/'
  'BM_Decode/(paged|paged_hnd|contiguous)/bfloat16/ctx:32768/threads:2/'
  'BM_Decode/(paged|paged_hnd|contiguous)/fp8_e4m3/ctx:8192/threads:2/'
  'BM_Decode/(paged|paged_hnd|contiguous)/fp8_e4m3/ctx:32768/threads:2/'
  'BM_DecodeMultiRow/(bfloat16|bfloat16_pairs|fp8_e4m3|fp8_e4m3_pairs)/rows:(1|5)/ctx:8192/threads:2/'
  'BM_WeightMatmul/bfloat16(_blocksum)?/rows:(1|8)/threads:2/'
  'BM_WeightMatmul/q8_0(_blocksum)?/rows:(1|8)/threads:2/'
  'BM_WeightMatmul/q4_1(_blocksum)?/rows:(1|8)/threads:2/'
)
echo "sitting: $rounds rounds of $bench, $min_time s a benchmark; files in $out" >&2
for r in $(seq 1 "$rounds"); do
  echo "round $r of $rounds" >&2
  for g in "${!groups[@]}"; do
    if ! "$bench" --benchmark_filter="BM_StreamRead/threads:2/|BM_CoreRoundTrip|${groups[$g]}" \
      --benchmark_min_time="$min_time" --benchmark_out="$out/round_${r}_$g.json" \
      --benchmark_out_format=json > /dev/null 2> "$out/round_${r}_$g.log"; then
      cat "$out/round_${r}_$g.log" >&2
      exit 1
    fi
  done
done
python3 "$here/scripts/kernels_sitting.py" "$out"
