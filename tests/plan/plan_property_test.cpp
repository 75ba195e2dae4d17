// Random synthetic models (native model files): every plan fits its memory, places every layer
// exactly once, and reports a concurrency that allocating on paper confirms.
#include <gtest/gtest.h>

#include <random>

#include <fmt/format.h>

#include "mixkv/model/model_json.hpp"
#include "plan/plan_test_support.hpp"

namespace mixkv::plan {
namespace {

model::ModelDesc random_model(std::mt19937_64& rng) {
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  model::ModelDesc desc;
  desc.model = "random";
  desc.num_spec_tokens = static_cast<int>(pick(0, 4));
  desc.facts.max_position_embeddings = 16 * pick(16, 4096);
  const int kinds = static_cast<int>(pick(1, 4));  // how many distinct layer shapes
  std::vector<model::LayerDesc> shapes;
  for (int k = 0; k < kinds; ++k) {
    model::LayerDesc l;
    const auto choice = pick(0, 4);
    const int kv = static_cast<int>(1 << pick(0, 4));
    l.num_kv_heads = kv;
    l.num_q_heads = kv * static_cast<int>(pick(1, 4));
    l.head_size = l.head_size_v = static_cast<int>(32 * pick(1, 8));
    l.kv_dtype = pick(0, 1) ? DType::kBfloat16 : DType::kFp8E4m3;
    if (choice == 0) l.kind = model::LayerKind::kFull;
    if (choice == 1) l.kind = model::LayerKind::kSliding, l.window = pick(64, 4096);
    if (choice == 2) l.kind = model::LayerKind::kChunked, l.chunk = pick(256, 8192);
    if (choice == 3)
      l.kind = model::LayerKind::kMla, l.num_kv_heads = 1, l.head_size = 576, l.head_size_v = 512;
    if (choice == 4) {
      l.kind = model::LayerKind::kGdn;
      l.state = {
          {"conv", {3 + desc.num_spec_tokens, 64 * pick(8, 128)}, DType::kBfloat16},
          {"temporal", {pick(1, 32), 128, 128}, pick(0, 1) ? DType::kFloat32 : DType::kBfloat16}};
    }
    shapes.push_back(l);
  }
  const int layers = static_cast<int>(pick(1, 40));
  for (int i = 0; i < layers; ++i) {
    model::LayerDesc l = shapes[static_cast<std::size_t>(pick(0, kinds - 1))];
    l.index = i;
    l.name = fmt::format("layers.{}", i);
    l.owner = pick(0, 9) == 0 ? model::Owner::kDraft : model::Owner::kTarget;
    if (l.owner == model::Owner::kDraft) l.name = fmt::format("draft.layers.{}", i);
    desc.layers.push_back(l);
  }
  model::validate(desc);
  return desc;
}

TEST(PlanProperties, RandomModelsGiveExecutablePlansUnderBothPolicies) {
  std::mt19937_64 rng(20261129);
  int planned = 0;
  for (int iteration = 0; iteration < 300; ++iteration) {
    const model::ModelDesc desc = random_model(rng);
    PlanOptions o;
    o.memory_bytes = std::int64_t{1} << std::uniform_int_distribution<int>(28, 36)(rng);
    o.request_len =
        std::uniform_int_distribution<std::int64_t>(1, *desc.facts.max_position_embeddings)(rng);
    o.backend = std::array{backend::Backend::kFlashinfer, backend::Backend::kFlashAttn,
                           backend::Backend::kCpu}[iteration % 3];
    for (Policy policy : {Policy::kVllm, Policy::kMixkv}) {
      o.policy = policy;
      const std::string label = fmt::format("iteration {} {}: {}", iteration, to_string(policy),
                                            model::to_json(desc).dump());
      try {
        const CachePlan plan = make_plan(desc, o);
        testing::expect_plan_invariants(desc, plan, label);
        ++planned;
      } catch (const Error& e) {
        // Too little memory or vLLM's page rules: a clear input error, never an internal one.
        EXPECT_NE(e.code(), ErrorCode::kInternal) << label << ": " << e.what();
      }
    }
  }
  EXPECT_GT(planned, 300);  // most random inputs are plannable
}

}  // namespace
}  // namespace mixkv::plan
