// Pieces shared by the deterministic mutation fuzz tests of the planner and the trace reader
// (tests/plan/plan_fuzz_test.cpp, tests/engine/trace_fuzz_test.cpp): a generator per input seeded
// from its iteration alone (so MIXKV_FUZZ_REPLAY=N reproduces input N), edge-case integers, and
// the iteration count (each test's own default, sized to seconds under the sanitizers;
// MIXKV_FUZZ_ITERATIONS overrides every fuzz test's count at once).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <vector>

namespace mixkv::testing {

using FuzzRng = std::mt19937_64;

inline FuzzRng fuzz_rng(std::uint64_t seed, std::uint64_t iteration) {
  return FuzzRng(seed ^ (iteration * 0x9e3779b97f4a7c15ULL));
}

inline bool fuzz_chance(FuzzRng& rng, int percent) {
  return static_cast<int>(rng() % 100) < percent;
}

template <typename T>
const T& fuzz_pick(FuzzRng& rng, const std::vector<T>& v) {
  return v[rng() % v.size()];
}

// Integers at the edges of what a field, a sum or a product can hold.
inline const std::vector<std::int64_t>& fuzz_edge_ints() {
  static const std::vector<std::int64_t> values = {0,
                                                   1,
                                                   -1,
                                                   2,
                                                   7,
                                                   15,
                                                   16,
                                                   17,
                                                   64,
                                                   1000,
                                                   4096,
                                                   65536,
                                                   1048576,
                                                   16777216,
                                                   1073741824,
                                                   2147483647,
                                                   2147483648,
                                                   4294967296,
                                                   4611686018427387904,
                                                   std::numeric_limits<std::int64_t>::max(),
                                                   std::numeric_limits<std::int64_t>::min()};
  return values;
}

inline std::optional<std::int64_t> fuzz_env(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  char* end = nullptr;
  const long long value = std::strtoll(text, &end, 10);
  if (*end != '\0' || value < 0) {
    ADD_FAILURE() << name << "='" << text << "' is not a non-negative integer";
    return std::nullopt;
  }
  return value;
}

inline std::int64_t fuzz_iterations(std::int64_t default_count) {
  return fuzz_env("MIXKV_FUZZ_ITERATIONS").value_or(default_count);
}

// Every number inside `node`, to aim a mutation straight at one.
inline void fuzz_numbers(nlohmann::json& node, std::vector<nlohmann::json*>& out) {
  if (node.is_number()) {
    out.push_back(&node);
  } else if (node.is_structured()) {
    for (auto& child : node) fuzz_numbers(child, out);
  }
}

}  // namespace mixkv::testing
