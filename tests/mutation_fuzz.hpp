// Pieces shared by the deterministic mutation fuzz tests (the planner, the trace reader, the
// server's request bodies, the GGUF and safetensors readers, a transfer peer's descriptor:
// tests/plan/plan_fuzz_test.cpp, tests/engine/trace_fuzz_test.cpp, tests/server/server_test.cpp,
// tests/weights/, tests/transfer/descriptor_fuzz_test.cpp): a generator per input seeded from its
// iteration alone (so MIXKV_FUZZ_REPLAY=N reproduces input N), edge-case integers, JSON values
// and byte damage, and the iteration count (each test's own default, sized to seconds under the
// sanitizers; MIXKV_FUZZ_ITERATIONS overrides every fuzz test's count at once).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <string_view>
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

// The loop of a fuzz test over inputs 0, 1, ...: `make(i)` builds input i, `check(input,
// &accepted)` returns the problem it finds ("" when the input was handled as it should) and says
// whether the input got through (planned, simulated) rather than being refused, `describe(input)`
// prints it. MIXKV_FUZZ_REPLAY=N runs input N alone and prints it; otherwise
// fuzz_iterations(default_count) inputs, stopping after three failures, each reported with its
// replay setting. From 500 inputs on, at least one in `accepted_one_in` must get through: inputs
// that are mostly refused would leave the stages behind the first check untested.
template <typename Make, typename Check, typename Describe>
void run_fuzz(std::string_view name, std::int64_t default_count, std::int64_t accepted_one_in,
              Make make, Check check, Describe describe) {
  if (const auto replay = fuzz_env("MIXKV_FUZZ_REPLAY")) {
    const auto input = make(static_cast<std::uint64_t>(*replay));
    bool accepted = false;
    const std::string problem = check(input, &accepted);
    std::cout << name << " iteration " << *replay << ": " << describe(input)
              << "\noutcome: " << (problem.empty() ? (accepted ? "accepted" : "refused") : problem)
              << "\n";
    EXPECT_TRUE(problem.empty()) << problem;
    return;
  }
  const std::int64_t iterations = fuzz_iterations(default_count);
  std::int64_t accepted_count = 0;
  int failures = 0;
  for (std::int64_t i = 0; i < iterations && failures < 3; ++i) {
    const auto input = make(static_cast<std::uint64_t>(i));
    bool accepted = false;
    const std::string problem = check(input, &accepted);
    accepted_count += accepted ? 1 : 0;
    if (!problem.empty()) {
      ++failures;
      ADD_FAILURE() << name << " iteration " << i << " (replay with MIXKV_FUZZ_REPLAY=" << i
                    << "): " << problem << "\n"
                    << describe(input);
    }
  }
  if (iterations >= 500) {
    EXPECT_GE(accepted_count * accepted_one_in, iterations)
        << accepted_count << " of " << iterations << " inputs got through";
  }
}

// Every number inside `node`, to aim a mutation straight at one.
inline void fuzz_numbers(nlohmann::json& node, std::vector<nlohmann::json*>& out) {
  if (node.is_number()) {
    out.push_back(&node);
  } else if (node.is_structured()) {
    for (auto& child : node) fuzz_numbers(child, out);
  }
}

// 1 to `max_edits` kinds of damage to a file's bytes: a byte changed, a 64-bit field overwritten
// with a large value, the file cut (no further edit once it is shorter than 8 bytes).
inline void fuzz_damage_bytes(std::vector<std::byte>& file, FuzzRng& rng, int max_edits) {
  for (auto edits = 1 + rng() % static_cast<std::uint64_t>(max_edits); edits > 0; --edits) {
    if (file.size() < 8) break;
    const std::size_t at = rng() % file.size();
    switch (rng() % 3) {
      case 0:
        file[at] = static_cast<std::byte>(rng() & 0xFF);
        break;
      case 1: {
        const std::uint64_t big = rng() >> (rng() % 64);
        std::memcpy(file.data() + std::min(at, file.size() - 8), &big, 8);
        break;
      }
      default:
        file.resize(at);
    }
  }
}

// Every value inside `node`, `node` itself included, to aim a mutation at any of them.
inline void fuzz_values(nlohmann::json& node, std::vector<nlohmann::json*>& out) {
  out.push_back(&node);
  if (node.is_structured()) {
    for (auto& child : node) fuzz_values(child, out);
  }
}

// A value of any JSON type, what a parser of typed fields must take or refuse by name: edge
// integers, fractions and huge floats, empty, long and non-ASCII strings, empty and nested
// arrays and objects.
inline nlohmann::json fuzz_json_value(FuzzRng& rng) {
  using nlohmann::json;
  switch (rng() % 9) {
    case 0:
      return nullptr;
    case 1:
      return fuzz_chance(rng, 50);
    case 2:
      return fuzz_pick(rng, fuzz_edge_ints());
    case 3: {
      static const std::vector<double> floats = {-0.0,  0.5,    1.5,    -2.5,   1e-310,
                                                 1e300, -1e300, 9.3e18, 1.8e19, 4294967296.0};
      return fuzz_pick(rng, floats);
    }
    case 4:
      return static_cast<std::uint64_t>(rng());
    case 5: {
      static const std::vector<std::string> strings = {
          "", "a", "\n", "\xc3\xa9\xe2\x82\xac", std::string(3000, 'x'), "user", "text"};
      return fuzz_pick(rng, strings);
    }
    case 6:
      return json::array();
    case 7:
      return json::object();
    default: {
      json nested = json::array({1, "a", json::array({2})});
      const auto depth = rng() % 40;
      for (std::uint64_t d = 0; d < depth; ++d) nested = json::array({nested});
      return nested;
    }
  }
}

}  // namespace mixkv::testing
