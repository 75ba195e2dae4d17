// A deterministic mutation fuzzer over the trace reader and the simulator: small JSONL traces
// whose numbers are pushed to the edges (2^62 prompts, 2^63 - 1 arrivals, negative lengths),
// whose lines are duplicated, dropped or cut, and whose bytes are flipped, simulated on a small
// plan. Every input must simulate (every request finished, the manager's invariants whole) or
// throw a mixkv::Error that is not kInternal.
//
// The default count is sized to a few seconds under the sanitizers; MIXKV_FUZZ_ITERATIONS
// changes it, MIXKV_FUZZ_REPLAY=N runs input N alone and prints it.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mixkv/core/error.hpp"
#include "mixkv/engine/simulate.hpp"
#include "mixkv/plan/plan.hpp"
#include "mutation_fuzz.hpp"
#include "test_support.hpp"

namespace mixkv::sim {
namespace {

using nlohmann::json;
using testing::fuzz_chance;
using testing::FuzzRng;

constexpr std::uint64_t kSeed = 0x6d69786b76747231;  // "mixkvtr1"
constexpr std::int64_t kDefaultIterations = 1500;

struct Setup {
  model::ModelDesc desc;
  plan::CachePlan plan;
};

const Setup& setup() {
  static const Setup s = [] {
    Setup out;
    model::DescribeOptions d;
    d.num_spec_tokens = 2;
    out.desc = testing::describe_builtin("llama-3.1-8b", std::nullopt, d);
    plan::PlanOptions o;
    o.max_model_len = 4096;
    o.request_len = 1024;
    o.memory_bytes = std::int64_t{1} << 30;  // a few hundred blocks: preemption happens
    out.plan = plan::make_plan(out.desc, o);
    return out;
  }();
  return s;
}

json random_request(FuzzRng& rng) {
  json r = {{"arrival_step", static_cast<std::int64_t>(rng() % 20)},
            {"output_len", static_cast<std::int64_t>(1 + rng() % 60)}};
  if (fuzz_chance(rng, 20)) {
    json ids = json::array();
    for (std::uint64_t i = 0, n = 1 + rng() % 40; i < n; ++i) ids.push_back(rng() % 1000);
    r["prompt"] = ids;
  } else {
    r["prompt_len"] = static_cast<std::int64_t>(1 + rng() % 3000);
    if (fuzz_chance(rng, 60)) r["prefix_id"] = static_cast<std::int64_t>(rng() % 3);
    if (r.contains("prefix_id") && fuzz_chance(rng, 40))
      r["prefix_len"] = static_cast<std::int64_t>(rng() % 2048);
  }
  return r;
}

std::string make_input(std::uint64_t iteration) {
  FuzzRng rng = testing::fuzz_rng(kSeed, iteration);
  std::vector<json> lines;
  for (std::uint64_t i = 0, n = 1 + rng() % 12; i < n; ++i) lines.push_back(random_request(rng));
  // Structural mutations: a field to an edge value, a field dropped or retyped, a line copied.
  for (int m = 0, count = static_cast<int>(rng() % 4); m < count; ++m) {
    json& line = lines[rng() % lines.size()];
    auto it = line.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(rng() % line.size()));
    switch (rng() % 5) {
      case 0:
      case 1:
        *it = testing::fuzz_pick(rng, testing::fuzz_edge_ints());
        break;
      case 2:
        line.erase(it.key());
        break;
      case 3:
        *it = fuzz_chance(rng, 50) ? json(it->dump()) : json(1e300);
        break;
      default:
        lines.push_back(lines[rng() % lines.size()]);
    }
  }
  std::string text;
  for (const auto& l : lines) text += l.dump() + (fuzz_chance(rng, 10) ? "\n\n" : "\n");
  // Textual mutations: a flipped byte, a cut, a huge number grown in place.
  for (int m = 0, count = fuzz_chance(rng, 30) ? 1 + static_cast<int>(rng() % 3) : 0; m < count;
       ++m) {
    const std::size_t pos = rng() % text.size();
    switch (rng() % 3) {
      case 0:
        text[pos] = static_cast<char>(text[pos] ^ (1 << (rng() % 8)));
        break;
      case 1:
        text.resize(pos + 1);
        break;
      default:
        if (const auto digit = text.find_first_of("0123456789", pos); digit != std::string::npos)
          text.insert(digit, "9999999999");
    }
  }
  return text;
}

// Empty when the input was handled correctly.
std::string check(const std::string& text, bool* simulated) {
  const Setup& s = setup();
  try {
    const auto trace = parse_trace(std::string_view(text), "fuzz.jsonl");
    SimOptions o;
    o.max_batch = 32;
    const SimReport r = simulate(s.plan, s.desc.num_spec_tokens, trace, o);
    if (!r.invariants.empty()) return "the manager broke an invariant: " + r.invariants;
    if (r.requests_finished != r.requests) {
      return fmt::format("{} of {} requests finished", r.requests_finished, r.requests);
    }
    *simulated = true;
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kInternal) return fmt::format("internal error: {}", e.what());
  } catch (const std::exception& e) {
    return fmt::format("escaped as a non-mixkv exception: {}", e.what());
  }
  return "";
}

TEST(TraceFuzz, EveryMutatedTraceSimulatesOrThrowsMixkvError) {
  testing::run_fuzz("trace fuzz", kDefaultIterations, 5, make_input, check,
                    [](const std::string& text) { return "\n" + text; });
}

}  // namespace
}  // namespace mixkv::sim
