// Benchmark counters whose exported value is what their name says. Google Benchmark inverts a
// rate into seconds per item, which --benchmark_format=json writes as 2.6e-08 under a name that
// ends in "ns": counting items in billions makes the inverted rate nanoseconds per item.
#pragma once

#include <benchmark/benchmark.h>

namespace mixkv::bench {

// Nanoseconds per item, for `items` handled over the whole run (every iteration together).
inline benchmark::Counter ns_per_item(double items) {
  return benchmark::Counter(items * 1e-9,
                            benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

}  // namespace mixkv::bench
