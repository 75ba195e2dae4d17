// The self-speculative drafter (the target's first L layers, final norm and LM head over the
// target's own cache of those layers): planned with no byte of its own, refused over recurrent
// layers, and greedy tokens and cache bytes identical to plain decoding at batch 1 and 16.
#include "mixkv/spec/self_draft.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "engine_test_support.hpp"
#include "mixkv/core/error.hpp"
#include "mixkv/model/describe.hpp"
#include "mixkv/plan/plan.hpp"

namespace mixkv::engine {
namespace {

using spec::SelfDrafter;
using testing::expect_same_tokens;

model::ModelSource source(std::string_view tiny) {
  return tiny_model_source(*find_tiny_model(tiny));
}

TEST(SelfDraft, DescribesNoLayerOfItsOwnAndPlansTheTargetsBytes) {
  const model::ModelSource src = source("tiny-swa");
  model::DescribeOptions d;
  d.draft_layers = 2;
  const model::ModelDesc self = model::describe_self(src, d);
  ASSERT_TRUE(self.draft_info);
  EXPECT_EQ(self.draft_info->kind, model::DraftKind::kSelf);
  EXPECT_EQ(self.draft_info->shared_target_layers, 2);
  EXPECT_EQ(self.draft, std::optional<std::string>("self"));
  EXPECT_EQ(self.num_spec_tokens, 3);
  for (const model::LayerDesc& l : self.layers) EXPECT_EQ(l.owner, model::Owner::kTarget) << l.name;
  // Same layers as the target alone, so the same plan: no byte is charged for the drafter.
  model::DescribeOptions three;
  three.num_spec_tokens = 3;
  const model::ModelDesc alone = model::describe(src, std::nullopt, three);
  EXPECT_EQ(self.layers, alone.layers);
  plan::PlanOptions po;
  po.memory_bytes = 8 << 20;
  po.backend = backend::Backend::kCpu;
  const plan::CachePlan a = plan::make_plan(self, po), b = plan::make_plan(alone, po);
  EXPECT_EQ(a.tensors, b.tensors);
  EXPECT_EQ(a.groups, b.groups);
  EXPECT_EQ(a.concurrency, b.concurrency);
  // Through describe_refs' name too, with the default layer count (at most layers - 1).
  const model::ModelDesc by_name = model::describe_refs("llama-3.1-8b", "self", {});
  EXPECT_EQ(by_name.draft_info->shared_target_layers, model::kDefaultSelfDraftLayers);
}

TEST(SelfDraft, LayerCountsOutOfRangeAndRecurrentLayersAreRefused) {
  for (int bad : {0, 4, -1}) {
    model::DescribeOptions d;
    d.draft_layers = bad;
    EXPECT_THROW(model::describe_self(source("tiny-swa"), d), Error) << bad;
  }
  // tiny-hybrid's first layers are Gated DeltaNet: drafting would advance their state.
  model::DescribeOptions d;
  d.draft_layers = 2;
  try {
    model::describe_self(source("tiny-hybrid"), d);
    FAIL() << "a recurrent shared layer was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("recurrent"), std::string::npos) << e.what();
  }
  model::DescribeOptions layers_only;
  layers_only.draft_layers = 3;
  EXPECT_THROW(model::describe_refs("llama-3.1-8b", std::nullopt, layers_only), Error);
  ModelRunner plain = testing::tiny_runner("tiny-swa");
  EXPECT_THROW(SelfDrafter{plain}, Error);
}

// Greedy tokens equal plain's, and so does every cached page of every finished request: the
// drafter's writes into the shared layers are rewritten by the verify before anything reads them.
void expect_plain(std::string_view tiny, int layers, bool batch16) {
  RunnerOptions ro;
  ro.num_spec_tokens = 3;
  ro.self_draft_layers = layers;
  ModelRunner runner = testing::tiny_runner(tiny, ro);
  const auto prompts =
      batch16 ? testing::mixed_prompts(
                    "Self drafting shares the first layers' pages with the "
                    "target, and nothing else.",
                    30, 3, 5)
              : std::vector<std::vector<TokenId>>{encode_bytes("Once upon a time, in a cache,")};
  GenerateOptions o;
  o.max_tokens = batch16 ? testing::kGeneratedTokens / 4 : testing::kGeneratedTokens;
  o.max_batch = 16;
  o.prefill_chunk = 24;
  std::vector<testing::CacheImage> images;
  o.before_free = [&](const cache::KvCacheManager& m, cache::RequestId id, std::size_t) {
    images.push_back(testing::cache_image(runner, m, id, [](const std::string&) { return true; }));
  };
  const GenerateReport plain = generate(runner, prompts, nullptr, o);
  o.num_spec_tokens = 3;
  SelfDrafter self(runner);
  const GenerateReport spec = generate(runner, prompts, &self, o);
  const std::string what =
      fmt::format("{} self drafter of {} layers, batch {}", tiny, layers, prompts.size());
  expect_same_tokens(plain, spec, what);
  std::int64_t drafted = 0;
  for (const auto& r : spec.requests) drafted += r.stats.drafted_tokens;
  EXPECT_GT(drafted, 0) << what;
  ASSERT_EQ(images.size(), 2 * prompts.size()) << what;
  // Requests may finish in another order (steps differ): each plain image must have its twin.
  std::size_t matched = 0;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    for (std::size_t j = prompts.size(); j < images.size(); ++j) {
      if (images[j] == images[i]) {
        ++matched;
        break;
      }
    }
  }
  EXPECT_EQ(matched, prompts.size()) << what << ": a cache image differs from plain decoding's";
}

TEST(SelfDraft, GreedyIsBitIdenticalToPlainAtBatchOne) {
  expect_plain("tiny-swa", 2, false);
  expect_plain("tiny-gemma", 1, false);  // soft caps and the embedding scale
}

TEST(SelfDraft, GreedyIsBitIdenticalToPlainInAMixedBatchOfSixteen) {
  expect_plain("tiny-swa", 3, true);
}

}  // namespace
}  // namespace mixkv::engine
