// Greedy generation: speculative decoding with an oracle or a random drafter gives exactly the
// tokens of plain decoding, at batch 1 and in a mixed batch; the scheduler's admission, prefix
// caching and preemption do not change a token.
#include "mixkv/engine/generator.hpp"
#include "engine_test_support.hpp"

#include <gtest/gtest.h>

#include <map>

#include "mixkv/core/error.hpp"

namespace mixkv::engine {
namespace {

using testing::references;

ModelRunner make_runner(const RunnerOptions& o = {}) { return testing::tiny_runner("tiny-swa", o); }

// tiny-swa with the tiny-eagle drafter's layers in the same plan, and both models' weights.
ModelRunner make_eagle_runner(const RunnerOptions& o) {
  const TinyModel& e = *find_tiny_model("tiny-eagle");
  return testing::runner_with_drafter("tiny-swa", tiny_model_source(e), e.seed, o);
}

std::vector<TokenId> text(std::string_view s) { return encode_bytes(s); }

// 16 prompts: lengths from 1 to 100 tokens (the longest beyond the 32-token window), every
// other one starting with the previous one's first 40 tokens.
std::vector<std::vector<TokenId>> mixed_batch() {
  return testing::mixed_prompts(
      "The quick brown fox jumps over the lazy dog while the cache keeps every page in place, "
      "and nothing is lost.",
      40, 5, 3);
}

// The K/V bytes of every verified position a request still holds, by layer and position.
using Pages = std::map<std::pair<std::string, std::int64_t>, std::vector<std::byte>>;
Pages cache_pages(const ModelRunner& runner, const cache::KvCacheManager& m, cache::RequestId id) {
  return testing::cache_image(runner, m, id, [](const std::string&) { return true; }).pages;
}

void expect_same_tokens(const GenerateReport& a, const GenerateReport& b) {
  testing::expect_same_tokens(a, b, "speculative against plain");
}

TEST(Generate, SpeculationIsBitIdenticalToPlainDecodingAtBatchOne) {
  ModelRunner runner = make_runner({.num_spec_tokens = 4});
  const std::vector<std::vector<TokenId>> prompts = {text("Once upon a time, in a paged cache,")};
  GenerateOptions o;
  o.max_tokens = 256;  // batch 1 is cheap: 256 in every build
  const GenerateReport plain = generate(runner, prompts, nullptr, o);
  ASSERT_EQ(plain.requests[0].tokens.size(), 256u);
  EXPECT_EQ(plain.requests[0].stats.decode_steps, 255);

  o.num_spec_tokens = 4;
  OracleDrafter oracle(references(prompts, plain));
  const GenerateReport fast = generate(runner, prompts, &oracle, o);
  expect_same_tokens(plain, fast);
  const RequestStats& s = fast.requests[0].stats;
  EXPECT_EQ(s.acceptance_rate(), 1.0);
  EXPECT_EQ(s.accepted_tokens + s.decode_steps, 255);  // every decode token verified once
  EXPECT_EQ(s.decode_steps, 51);                       // 255 tokens in steps of 1 + 4
  EXPECT_DOUBLE_EQ(s.mean_accepted_length(), 5.0);

  RandomDrafter random(runner.vocab_size(), 1);
  const GenerateReport slow = generate(runner, prompts, &random, o);
  expect_same_tokens(plain, slow);
  EXPECT_LT(slow.requests[0].stats.acceptance_rate(), 0.05);
  EXPECT_GT(slow.requests[0].stats.drafted_tokens, 900);
}

// Adaptive draft length: drafts that keep failing shrink towards plain decoding (few drafted
// tokens), drafts that always pass stay at k; tokens stay plain's. Per draft position, the
// oracle's drafts are all accepted and the counts add up to the totals.
TEST(Generate, AdaptiveDraftLengthFallsBackOnFailingDraftsAndKeepsPlainTokens) {
  ModelRunner runner = make_runner({.num_spec_tokens = 4});
  const std::vector<std::vector<TokenId>> prompts = {text("Once upon a time, in a paged cache,")};
  GenerateOptions o;
  o.max_tokens = 96;
  const GenerateReport plain = generate(runner, prompts, nullptr, o);
  o.num_spec_tokens = 4;
  RandomDrafter fixed_random(runner.vocab_size(), 1);
  const GenerateReport fixed = generate(runner, prompts, &fixed_random, o);
  o.adaptive_draft = true;
  // A fixed cost (a verify row a quarter of a step), so the lengths do not follow the timings.
  o.step_cost = std::make_shared<sched::LinearStepCost>(1.0, 0.25);
  RandomDrafter random(runner.vocab_size(), 1);
  const GenerateReport adaptive = generate(runner, prompts, &random, o);
  expect_same_tokens(plain, adaptive);
  const RequestStats& a = adaptive.requests[0].stats;
  EXPECT_GT(fixed.requests[0].stats.drafted_tokens, 300);
  EXPECT_LT(a.drafted_tokens, 30);  // 2 + 1 at first, then one probe every 8 plain steps
  EXPECT_GT(a.drafted_tokens, 5);
  ASSERT_EQ(a.drafted_per_position.size(), 4u);
  EXPECT_GE(a.drafted_per_position[0], a.drafted_per_position[3]);

  OracleDrafter oracle(references(prompts, plain));
  const GenerateReport fast = generate(runner, prompts, &oracle, o);
  expect_same_tokens(plain, fast);
  const RequestStats& s = fast.requests[0].stats;
  // 95 tokens in steps of 1 + 4 (19 steps) once the estimate has risen from its prior: the
  // first steps draft 2, then 3.
  EXPECT_LE(s.decode_steps, 21);
  EXPECT_GE(s.decode_steps, 19);
  std::int64_t drafted = 0;
  std::int64_t accepted = 0;
  for (std::size_t p = 0; p < 4; ++p) {
    EXPECT_EQ(s.accepted_per_position[p], s.drafted_per_position[p]) << "position " << p;
    drafted += s.drafted_per_position[p];
    accepted += s.accepted_per_position[p];
  }
  EXPECT_EQ(drafted, s.drafted_tokens);
  EXPECT_EQ(accepted, s.accepted_tokens);
}

TEST(Generate, SpeculationIsBitIdenticalInAMixedBatchOfSixteen) {
  ModelRunner runner = make_runner({.num_spec_tokens = 3});
  const auto prompts = mixed_batch();
  GenerateOptions o;
  o.max_tokens = testing::kGeneratedTokens;
  o.max_batch = 16;
  o.prefill_chunk = 24;
  const GenerateReport plain = generate(runner, prompts, nullptr, o);
  o.num_spec_tokens = 3;
  OracleDrafter oracle(references(prompts, plain));
  const GenerateReport fast = generate(runner, prompts, &oracle, o);
  expect_same_tokens(plain, fast);
  // Random drafts, nearly all rolled back; two per step keep the test short.
  o.num_spec_tokens = 2;
  RandomDrafter random(runner.vocab_size(), 2);
  const GenerateReport slow = generate(runner, prompts, &random, o);
  expect_same_tokens(plain, slow);
  o.num_spec_tokens = 3;
  for (const auto& r : fast.requests) EXPECT_EQ(r.stats.acceptance_rate(), 1.0);

  // Five at a time: later requests find their shared prefix cached, and still match.
  o.max_batch = 5;
  const GenerateReport narrow = generate(runner, prompts, &oracle, o);
  expect_same_tokens(plain, narrow);
  std::int64_t hits = 0;
  for (const auto& r : narrow.requests) hits += r.stats.prefix_hit_tokens;
  EXPECT_GT(hits, 0);

  // Each request alone (another batch composition, another chunking) gives the same tokens.
  o.num_spec_tokens = 0;
  o.prefill_chunk = 7;
  for (std::size_t i : {std::size_t{0}, std::size_t{15}}) {
    const std::vector<std::vector<TokenId>> one = {prompts[i]};
    EXPECT_EQ(generate(runner, one, nullptr, o).requests[0].tokens, plain.requests[i].tokens)
        << "request " << i;
  }
}

TEST(NgramDrafter, ProposesWhatFollowedTheLastOccurrenceAndExtendsCycles) {
  NgramDrafter d(1, 3);
  // "a b c x a b" -> the last "a b" was followed by "c x a b c ..."
  const std::vector<TokenId> t = {1, 2, 3, 9, 1, 2};
  EXPECT_EQ(d.propose({.tokens = t}, 3), (std::vector<TokenId>{3, 9, 1}));
  // A cycle of period 2 yields as many tokens as asked.
  const std::vector<TokenId> cycle = {5, 7, 5, 7};
  EXPECT_EQ(d.propose({.tokens = cycle}, 5), (std::vector<TokenId>{5, 7, 5, 7, 5}));
  // Nothing repeats: nothing proposed.
  const std::vector<TokenId> fresh = {1, 2, 3, 4};
  EXPECT_TRUE(d.propose({.tokens = fresh}, 3).empty());
  EXPECT_THROW(NgramDrafter(0, 2), Error);
}

TEST(Generate, NgramDraftsAreVerifiedIntoThePlainTokens) {
  ModelRunner runner = make_runner({.num_spec_tokens = 4});
  const auto prompts = mixed_batch();
  const std::vector<std::vector<TokenId>> some = {prompts[0], prompts[3], prompts[8]};
  GenerateOptions o;
  o.max_tokens = 128;
  const GenerateReport plain = generate(runner, some, nullptr, o);
  o.num_spec_tokens = 4;
  NgramDrafter ngram;
  const GenerateReport got = generate(runner, some, &ngram, o);
  expect_same_tokens(plain, got);
  for (const auto& r : got.requests) {
    EXPECT_GT(r.stats.drafted_tokens, 0);
    EXPECT_LT(r.stats.decode_steps, 127);  // some drafts were accepted: fewer target steps
  }
}

TEST(Generate, RollbackLeavesTheCacheByteForByteAsPlainDecoding) {
  ModelRunner runner = make_runner({.num_spec_tokens = 3});
  const std::vector<std::vector<TokenId>> prompts = {text("rollback: every rejected draft"),
                                                     text(std::string(45, 'w'))};
  GenerateOptions o;
  o.max_tokens = 80;
  std::vector<Pages> images;
  o.before_free = [&](const cache::KvCacheManager& m, cache::RequestId id, std::size_t) {
    images.push_back(cache_pages(runner, m, id));
  };
  const GenerateReport plain = generate(runner, prompts, nullptr, o);
  o.num_spec_tokens = 3;
  RandomDrafter random(runner.vocab_size(), 3);
  const GenerateReport spec = generate(runner, prompts, &random, o);
  expect_same_tokens(plain, spec);
  ASSERT_EQ(images.size(), 4u);
  // Sliding layers hold the window only, full layers everything: 2 full layers of 30 + 79
  // positions, so the images are not trivially empty.
  EXPECT_GT(images[0].size(), 2u * (30 + 79));
  EXPECT_EQ(images[0].size() + images[1].size(), images[2].size() + images[3].size());
  for (std::size_t i = 0; i < 2; ++i) {
    const Pages& want = images[i];
    const Pages& got = images[i + 2];
    EXPECT_EQ(want.size(), got.size());
    for (const auto& [key, bytes] : want) {
      const auto it = got.find(key);
      ASSERT_NE(it, got.end()) << key.first << " position " << key.second;
      EXPECT_EQ(it->second, bytes) << key.first << " position " << key.second;
    }
  }
}

TEST(TinyEagle, ItsLayersArePlannedBesideTheTargetsWithTheirOwnHeadsAndDtype) {
  ModelRunner runner = make_eagle_runner({.num_spec_tokens = 3});
  ASSERT_TRUE(runner.has_drafter());
  const model::LayerDesc& draft = runner.desc().layers.back();
  EXPECT_EQ(draft.name, "draft.layers.0");
  EXPECT_EQ(draft.owner, model::Owner::kDraft);
  EXPECT_EQ(draft.num_kv_heads, 4);  // MHA beside the GQA target
  EXPECT_EQ(runner.desc().layers.front().num_kv_heads, 2);
  EXPECT_EQ(draft.kv_dtype, DType::kBfloat16);
  EXPECT_EQ(runner.desc().layers.front().kv_dtype, DType::kFloat32);
  const layout::LayerGeometry& g = runner.geometry().layer("draft.layers.0");
  EXPECT_EQ(g.k_token_bytes, 4 * 16 * 2);
}

TEST(Generate, EagleSpeculationIsBitIdenticalToPlainDecoding) {
  ModelRunner runner = make_eagle_runner({.num_spec_tokens = 4});
  GenerateOptions o;
  o.max_tokens = testing::kGeneratedTokens;
  const std::vector<std::vector<TokenId>> one = {text("Once upon a time, in a paged cache,")};
  const GenerateReport plain = generate(runner, one, nullptr, o);
  o.num_spec_tokens = 4;
  EagleDrafter eagle(runner);
  const GenerateReport got = generate(runner, one, &eagle, o);
  expect_same_tokens(plain, got);
  const RequestStats& st = got.requests[0].stats;
  // k drafts per step, fewer only in the last steps, where fewer tokens are left.
  EXPECT_LE(st.drafted_tokens, 4 * st.decode_steps);
  EXPECT_GE(st.drafted_tokens, 4 * (st.decode_steps - 4));

  // A mixed batch of 16 (shared prefixes, a prompt beyond the window), 256 tokens each; the
  // drafter runs every request's chain position in one forward.
  const auto prompts = mixed_batch();
  o.num_spec_tokens = 0;
  const GenerateReport plain16 = generate(runner, prompts, nullptr, o);
  o.num_spec_tokens = 4;
  const GenerateReport got16 = generate(runner, prompts, &eagle, o);
  expect_same_tokens(plain16, got16);

  // Six at a time, 48 tokens (the start of the plain run's): later requests take prefix hits,
  // drafter blocks included.
  o.max_tokens = 48;
  o.max_batch = 6;
  const GenerateReport hits = generate(runner, prompts, &eagle, o);
  EXPECT_GT(testing::expect_prefix_of(plain16, hits, "six at a time"), 0);
}

TEST(Generate, EagleDrafterCacheDoesNotDependOnHowManyTokensWereDrafted) {
  ModelRunner runner = make_eagle_runner({.num_spec_tokens = 4});
  const std::vector<std::vector<TokenId>> prompts = {text("the drafter's own pages"),
                                                     text(std::string(40, 'q'))};
  GenerateOptions o;
  o.max_tokens = 60;
  std::vector<Pages> images;
  o.before_free = [&](const cache::KvCacheManager& m, cache::RequestId id, std::size_t) {
    images.push_back(cache_pages(runner, m, id));
  };
  EagleDrafter eagle(runner);
  for (int k : {1, 4}) {
    o.num_spec_tokens = k;
    generate(runner, prompts, &eagle, o);
  }
  ASSERT_EQ(images.size(), 4u);
  std::size_t drafter_positions = 0;
  for (const auto& [key, bytes] : images[0]) drafter_positions += key.first == "draft.layers.0";
  EXPECT_EQ(drafter_positions, 23u + 59u);  // every verified position of request 0
  EXPECT_EQ(images[0], images[2]);
  EXPECT_EQ(images[1], images[3]);
}

TEST(Generate, PrefixCachingServesASharedPrompt) {
  ModelRunner runner = make_runner();
  std::vector<TokenId> shared = text(std::string(70, 'x') + "tail one");
  std::vector<TokenId> other = text(std::string(70, 'x') + "tail two, longer");
  GenerateOptions o;
  o.max_tokens = 8;
  o.max_batch = 1;  // the second request is admitted after the first computed the prefix
  const std::vector<std::vector<TokenId>> prompts = {shared, other};
  const GenerateReport r = generate(runner, prompts, nullptr, o);
  EXPECT_EQ(r.requests[0].stats.prefix_hit_tokens, 0);
  EXPECT_EQ(r.requests[1].stats.prefix_hit_tokens, 64);  // whole 16-token blocks of the prefix
  o.prefix_caching = false;
  const GenerateReport cold = generate(runner, prompts, nullptr, o);
  EXPECT_EQ(cold.requests[1].stats.prefix_hit_tokens, 0);
  expect_same_tokens(r, cold);
}

TEST(Generate, PreemptionByRecomputeKeepsTheTokens) {
  const auto prompts = mixed_batch();
  GenerateOptions o;
  o.max_tokens = 96;
  o.max_batch = 16;
  ModelRunner roomy = make_runner({.num_spec_tokens = 2});
  const GenerateReport want = generate(roomy, prompts, nullptr, o);
  // 256 KiB hold about 1.5 requests of 256 tokens, far from 16 growing ones.
  ModelRunner tight =
      make_runner({.memory_bytes = 256 << 10, .max_model_len = 256, .num_spec_tokens = 2});
  o.num_spec_tokens = 2;
  OracleDrafter oracle(references(prompts, want));
  const GenerateReport got = generate(tight, prompts, &oracle, o);
  EXPECT_GT(got.preemptions, 0);
  expect_same_tokens(want, got);
}

TEST(Generate, BadOptionsAndOversizedPromptsAreRefused) {
  ModelRunner runner = make_runner({.max_model_len = 128});
  GenerateOptions o;
  o.max_tokens = 0;
  const std::vector<std::vector<TokenId>> p = {text("hi")};
  EXPECT_THROW(generate(runner, p, nullptr, o), Error);
  o.max_tokens = 200;
  try {
    generate(runner, p, nullptr, o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_model_len 128"), std::string::npos) << e.what();
  }
  const std::vector<std::vector<TokenId>> empty = {{}};
  o.max_tokens = 4;
  EXPECT_THROW(generate(runner, empty, nullptr, o), Error);
  // More speculative tokens than the runner's cache was planned for (0 here).
  o.num_spec_tokens = 2;
  RandomDrafter random(runner.vocab_size(), 1);
  try {
    generate(runner, p, &random, o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "--num-spec-tokens 2 exceeds the 0 speculative tokens the runner's cache was planned "
              "for; build the runner with RunnerOptions::num_spec_tokens = 2");
  }
}

}  // namespace
}  // namespace mixkv::engine
