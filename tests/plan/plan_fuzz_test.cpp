// A deterministic mutation fuzzer over the planner: native model files of built-in pairs, with
// their numbers, layers and kinds mutated, planned under random options (policy, backend,
// memory, block size, max_model_len, request_len) and laid out. Every input must either plan
// (then the attention groups and the geometry build) or throw a mixkv::Error that is not
// kInternal. Any other exception, an internal error or a crash is a bug.
//
// The default count is sized to a few seconds under the sanitizers; MIXKV_FUZZ_ITERATIONS
// changes it, MIXKV_FUZZ_REPLAY=N runs input N alone and prints it.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mixkv/attn/attention_groups.hpp"
#include "mixkv/core/error.hpp"
#include "mixkv/layout/geometry.hpp"
#include "mixkv/model/describe.hpp"
#include "mixkv/model/model_json.hpp"
#include "mixkv/plan/plan.hpp"
#include "mutation_fuzz.hpp"

namespace mixkv::plan {
namespace {

using mixkv::testing::fuzz_chance;
using mixkv::testing::FuzzRng;
using nlohmann::json;

constexpr std::uint64_t kSeed = 0x6d69786b76706c31;  // "mixkvpl1"
constexpr std::int64_t kDefaultIterations = 1500;

const std::vector<json>& seeds() {
  static const std::vector<json> out = [] {
    const struct {
      const char* target;
      const char* draft;
      int tp;
    } pairs[] = {{"qwen3.5-27b", "dflash-qwen3.5-27b", 1},
                 {"gpt-oss-20b", "eagle3-gpt-oss-20b", 2},
                 {"qwen3-next-80b-a3b", nullptr, 4},
                 {"nemotron-h-8b", nullptr, 1},
                 {"deepseek-v3", "mtp", 8},
                 {"gemma-3-27b", nullptr, 1},
                 {"llama-3.1-8b", nullptr, 1}};
    std::vector<json> docs;
    for (const auto& p : pairs) {
      model::DescribeOptions o;
      o.tp = p.tp;
      std::optional<std::string_view> draft;
      if (p.draft != nullptr) draft = p.draft;
      docs.push_back(model::to_json(model::describe_refs(p.target, draft, o)));
    }
    return docs;
  }();
  return out;
}

struct Input {
  json doc;
  PlanOptions options;
  std::string report() const {
    return fmt::format(
        "policy {} backend {} memory {} block_size {} max_model_len {} "
        "request_len {}\nmodel file: {}",
        to_string(options.policy), backend::to_string(options.backend), options.memory_bytes,
        options.block_size.value_or(0), options.max_model_len, options.request_len, doc.dump());
  }
};

void mutate(json& doc, FuzzRng& rng) {
  json& layers = doc["layers"];
  const int count = 1 + static_cast<int>(rng() % 3);
  for (int m = 0; m < count; ++m) {
    json& layer = layers[rng() % layers.size()];
    switch (rng() % 6) {
      case 0:
      case 1: {  // a number of some layer (heads, head size, window, index, a state dimension)
        std::vector<json*> numbers;
        mixkv::testing::fuzz_numbers(layer, numbers);
        if (!numbers.empty()) {
          json& n = *numbers[rng() % numbers.size()];
          n = fuzz_chance(rng, 70)
                  ? json(mixkv::testing::fuzz_pick(rng, mixkv::testing::fuzz_edge_ints()))
                  : json(static_cast<std::int64_t>(rng() % 300));
        }
        break;
      }
      case 2: {  // another kind or dtype
        static const std::vector<std::string> kinds = {"full", "sliding", "chunked", "mla",
                                                       "gdn",  "kda",     "mamba2"};
        static const std::vector<std::string> dtypes = {"bfloat16", "float32", "fp8_e4m3", "nvfp4"};
        if (fuzz_chance(rng, 50)) {
          layer["kind"] = mixkv::testing::fuzz_pick(rng, kinds);
        } else if (layer.contains("kv_dtype")) {
          layer["kv_dtype"] = mixkv::testing::fuzz_pick(rng, dtypes);
        }
        break;
      }
      case 3: {  // a copy of another layer under a new name (more layers, shared kinds)
        json copy = layers[rng() % layers.size()];
        copy["name"] = fmt::format("fuzz.{}", rng() % 1000);
        layers.push_back(std::move(copy));
        break;
      }
      case 4:
        if (layers.size() > 1) layers.erase(rng() % layers.size());
        break;
      default:  // top-level numbers: tp, num_spec_tokens, facts
        if (fuzz_chance(rng, 50)) {
          doc["num_spec_tokens"] = static_cast<std::int64_t>(rng() % 40);
        } else {
          doc["facts"]["max_position_embeddings"] =
              fuzz_chance(rng, 50)
                  ? json(mixkv::testing::fuzz_pick(rng, mixkv::testing::fuzz_edge_ints()))
                  : json(static_cast<std::int64_t>(16 + rng() % 300000));
        }
    }
  }
}

Input make_input(std::uint64_t iteration) {
  FuzzRng rng = mixkv::testing::fuzz_rng(kSeed, iteration);
  Input in;
  in.doc = mixkv::testing::fuzz_pick(rng, seeds());
  if (fuzz_chance(rng, 85)) mutate(in.doc, rng);
  PlanOptions& o = in.options;
  o.policy = fuzz_chance(rng, 50) ? Policy::kVllm : Policy::kMixkv;
  const auto backends = backend::backend_names();
  o.backend = *backend::parse_backend(backends[rng() % backends.size()]);
  // Lengths and memory within the command line's ranges: the planner names what does not fit.
  static const std::vector<std::int64_t> memories = {
      0, 1, 4096, 1 << 20, std::int64_t{1} << 30, std::int64_t{40} << 30, std::int64_t{1} << 40};
  o.memory_bytes = fuzz_chance(rng, 70)
                       ? mixkv::testing::fuzz_pick(rng, memories)
                       : static_cast<std::int64_t>(rng() % (std::int64_t{1} << 36));
  static const std::vector<std::int64_t> blocks = {0, 1, 7, 16, 32, 64, 528, 1024, 4096};
  if (fuzz_chance(rng, 40)) o.block_size = mixkv::testing::fuzz_pick(rng, blocks);
  static const std::vector<std::int64_t> lengths = {0, 1, 15, 16, 2500, 4096, 131072, 1 << 24};
  if (fuzz_chance(rng, 60)) o.max_model_len = mixkv::testing::fuzz_pick(rng, lengths);
  if (fuzz_chance(rng, 60)) o.request_len = mixkv::testing::fuzz_pick(rng, lengths);
  return in;
}

// Empty when the input was handled correctly.
std::string check(const Input& in, bool* planned) {
  try {
    const model::ModelDesc desc = model::model_desc_from_json(in.doc, "fuzz.json");
    const CachePlan plan = make_plan(desc, in.options);
    const auto groups = attn::build_attention_groups(desc, plan);
    layout::make_geometry(desc, plan, groups);
    *planned = true;
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kInternal) return fmt::format("internal error: {}", e.what());
  } catch (const std::exception& e) {
    return fmt::format("escaped as a non-mixkv exception: {}", e.what());
  }
  return "";
}

TEST(PlanFuzz, EveryMutatedModelFileAndOptionPlansOrThrowsMixkvError) {
  mixkv::testing::run_fuzz("plan fuzz", kDefaultIterations, 10, make_input, check,
                           [](const Input& in) { return in.report(); });
}

}  // namespace
}  // namespace mixkv::plan
