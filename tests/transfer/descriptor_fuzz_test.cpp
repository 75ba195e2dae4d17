// A deterministic mutation fuzzer over what a transfer peer sends: a layout descriptor (JSON) and
// a request's block table. One side's descriptor has its values replaced by values of any type
// (edge integers, strings, arrays) or members dropped, the other side stays real; the block ids
// may be mutated too. descriptor_from_json, reconcile and plan_pull must refuse with a bad-input
// Error or give runs that lie inside both sides' tensors (the local side's real ones included):
// a peer can never make this side read or write outside what it registered.
//
// MIXKV_FUZZ_ITERATIONS changes the count, MIXKV_FUZZ_REPLAY=N runs input N alone and prints it.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mixkv/core/error.hpp"
#include "mixkv/transfer/layout_descriptor.hpp"
#include "mixkv/transfer/transfer_plan.hpp"
#include "mutation_fuzz.hpp"
#include "transfer/transfer_test_support.hpp"

namespace mixkv::transfer {
namespace {

using nlohmann::json;

constexpr std::uint64_t kFuzzSeed = 0x6d69786b76706431;  // "mixkvpd1"
constexpr std::int64_t kFuzzIterations = 1500;
constexpr std::int64_t kFuzzTokens = 200;

struct Pair {
  testing::Side prefill, decode;
  RequestBlocks prefill_blocks, decode_blocks;
};

// Pairs that reconcile as they are: equal layouts, other block sizes and policies, hybrid states
// with a block drafter, heterogeneous tensor parallelism.
const std::vector<Pair>& pairs() {
  static const std::vector<Pair> out = [] {
    std::vector<Pair> v;
    const auto add = [&](const testing::SideOptions& p, const testing::SideOptions& d) {
      Pair x{testing::make_side(p), testing::make_side(d), {}, {}};
      x.prefill_blocks = testing::make_blocks(x.prefill, kFuzzTokens, 3);
      x.decode_blocks = testing::make_blocks(x.decode, kFuzzTokens, 5);
      v.push_back(std::move(x));
    };
    const auto swa = testing::side("tiny-swa", "tiny-eagle");
    testing::SideOptions other = swa;
    other.policy = plan::Policy::kVllm;
    other.block_size = 32;
    add(swa, other);
    add(testing::side("tiny-hybrid", "tiny-dflash"), testing::side("tiny-hybrid", "tiny-dflash"));
    testing::SideOptions tp2 = testing::side("tiny-swa");
    tp2.tp = 2;
    add(testing::side("tiny-swa"), tp2);
    return v;
  }();
  return out;
}

struct Input {
  std::size_t pair = 0;
  bool mutate_prefill = false;
  json descriptor;  // the mutated side's
  RequestBlocks prefill_blocks, decode_blocks;
  std::string report() const {
    return fmt::format("pair {}, mutated side: {}\ndescriptor: {}", pair,
                       mutate_prefill ? "prefill" : "decode", descriptor.dump());
  }
};

Input make_input(std::uint64_t iteration) {
  mixkv::testing::FuzzRng rng = mixkv::testing::fuzz_rng(kFuzzSeed, iteration);
  Input in;
  in.pair = rng() % pairs().size();
  const Pair& p = pairs()[in.pair];
  in.mutate_prefill = mixkv::testing::fuzz_chance(rng, 50);
  in.descriptor = to_json(in.mutate_prefill ? p.prefill.descriptor : p.decode.descriptor);
  in.prefill_blocks = p.prefill_blocks;
  in.decode_blocks = p.decode_blocks;
  for (auto edits = 1 + rng() % 3; edits > 0; --edits) {
    if (mixkv::testing::fuzz_chance(rng, 60)) {  // a number: offsets, strides, sizes, shapes
      std::vector<json*> numbers;
      mixkv::testing::fuzz_numbers(in.descriptor, numbers);
      if (numbers.empty()) continue;  // an earlier edit replaced the whole document
      *numbers[rng() % numbers.size()] =
          mixkv::testing::fuzz_chance(rng, 70)
              ? json(mixkv::testing::fuzz_pick(rng, mixkv::testing::fuzz_edge_ints()))
              : json(static_cast<std::int64_t>(rng() % 5000));
    } else {
      std::vector<json*> values;
      mixkv::testing::fuzz_values(in.descriptor, values);
      json& at = *values[rng() % values.size()];
      if (at.is_structured() && !at.empty() && mixkv::testing::fuzz_chance(rng, 30)) {
        at.erase(at.begin());
      } else {
        at = mixkv::testing::fuzz_json_value(rng);
      }
    }
  }
  if (mixkv::testing::fuzz_chance(rng, 20)) {  // the peer's block table
    RequestBlocks& b = in.mutate_prefill ? in.prefill_blocks : in.decode_blocks;
    auto& ids = b.groups[rng() % b.groups.size()];
    if (!ids.empty()) {
      ids[rng() % ids.size()] = mixkv::testing::fuzz_pick(rng, mixkv::testing::fuzz_edge_ints());
    }
  }
  return in;
}

// Empty when the input was handled correctly; `planned` when it gave a plan.
std::string check(const Input& in, bool* planned) {
  const Pair& p = pairs()[in.pair];
  try {
    const LayoutDescriptor mutated = descriptor_from_json(in.descriptor);
    const LayoutDescriptor& pre = in.mutate_prefill ? mutated : p.prefill.descriptor;
    const LayoutDescriptor& dec = in.mutate_prefill ? p.decode.descriptor : mutated;
    reconcile(pre, dec);
    const PullPlan plan =
        plan_pull(pre, dec, in.prefill_blocks, in.decode_blocks, {kFuzzTokens, 0});
    *planned = true;
    // The real side's tensors are its descriptor's sizes; the peer's are what it claims.
    return testing::run_outside_tensors(plan, pre, dec);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kInvalidInput) {
      return fmt::format("not a bad-input error ({}): {}", static_cast<int>(e.code()), e.what());
    }
  } catch (const std::exception& e) {
    return fmt::format("escaped as a non-mixkv exception: {}", e.what());
  }
  return "";
}

TEST(DescriptorFuzz, EveryMutatedPeerDescriptorPlansInsideTheTensorsOrIsRefused) {
  mixkv::testing::run_fuzz("descriptor fuzz", kFuzzIterations, 20, make_input, check,
                           [](const Input& in) { return in.report().substr(0, 4000); });
}

}  // namespace
}  // namespace mixkv::transfer
