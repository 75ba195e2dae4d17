// The manager over real plans: prefix hits valid for every group, all-or-nothing allocation,
// speculative look-ahead and rollback, sliding-window reclamation, recurrent checkpoints.
#include "mixkv/cache/kv_cache_manager.hpp"

#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "test_support.hpp"

namespace mixkv::cache {
namespace {

// A plan of about `blocks` blocks for `desc`, with short requests.
plan::CachePlan small_plan(const model::ModelDesc& desc, plan::Policy policy, std::int64_t blocks,
                           std::int64_t max_len = 2048) {
  plan::PlanOptions o;
  o.policy = policy;
  o.max_model_len = max_len;
  o.request_len = 512;
  o.memory_bytes = std::int64_t{8} << 30;
  const std::int64_t unit = plan::make_plan(desc, o).block_unit_bytes;
  o.memory_bytes = unit * blocks;
  return plan::make_plan(desc, o);
}

std::vector<TokenId> tokens(std::int64_t n, TokenId start = 1) {
  std::vector<TokenId> t(static_cast<std::size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

int group_of(const plan::CachePlan& plan, plan::Behaviour b) {
  for (const auto& g : plan.groups) {
    if (g.behaviour == b) return g.id;
  }
  return -1;
}

TEST(KvCacheManager, SecondRequestWithTheSamePrefixHitsEveryFullBlock) {
  const auto desc = testing::describe_builtin("llama-3.1-8b");
  const auto plan = small_plan(desc, plan::Policy::kVllm, 400);
  KvCacheManager m(plan, 0);
  m.add_request(RequestId{1}, tokens(100));
  ASSERT_EQ(m.admit(RequestId{1}, 0), 0);
  m.commit(RequestId{1}, 100, std::vector<TokenId>{500});
  ASSERT_EQ(m.check_invariants(), "");
  m.add_request(RequestId{2}, tokens(100));
  // 6 full 16-token blocks = 96 tokens; the last prompt token is always recomputed.
  EXPECT_EQ(m.find_prefix_hit(RequestId{2}), 96);
  ASSERT_EQ(m.admit(RequestId{2}, 0), 96);
  EXPECT_EQ(m.block_table(RequestId{2}, 0).subspan(0, 6)[0], m.block_table(RequestId{1}, 0)[0]);
  EXPECT_EQ(m.pool().ref_count(m.block_table(RequestId{1}, 0)[0]), 2);
  EXPECT_EQ(m.check_invariants(), "");
  m.free(RequestId{1});
  m.free(RequestId{2});
  EXPECT_EQ(m.pool().num_used(), 0);
  EXPECT_EQ(m.check_invariants(), "");
}

TEST(KvCacheManager, FailedAdmissionAndAllocationChangeNothing) {
  const auto desc = testing::describe_builtin("llama-3.1-8b");
  const auto plan =
      small_plan(desc, plan::Policy::kVllm, 20, 256);  // 19 usable blocks of 16 tokens
  KvCacheManager m(plan, 0);
  m.add_request(RequestId{1}, tokens(200));
  ASSERT_TRUE(m.admit(RequestId{1}, 0).has_value());  // 13 blocks
  m.add_request(RequestId{2}, tokens(200, 1000));
  const auto free_before = m.pool().num_free();
  EXPECT_FALSE(m.admit(RequestId{2}, 0).has_value());
  EXPECT_EQ(m.pool().num_free(), free_before);
  EXPECT_TRUE(m.block_table(RequestId{2}, 0).empty());
  const auto table_before = std::vector<BlockId>(m.block_table(RequestId{1}, 0).begin(),
                                                 m.block_table(RequestId{1}, 0).end());
  EXPECT_FALSE(m.allocate(RequestId{1}, 400, 0));  // 25 blocks, 12 more than free
  EXPECT_EQ(std::vector<BlockId>(m.block_table(RequestId{1}, 0).begin(),
                                 m.block_table(RequestId{1}, 0).end()),
            table_before);
  EXPECT_EQ(m.check_invariants(), "");
}

TEST(KvCacheManager, RejectedDraftSlotsAreReusedAndNeverCached) {
  const auto desc = testing::describe_builtin("llama-3.1-8b");
  const auto plan = small_plan(desc, plan::Policy::kVllm, 400);
  KvCacheManager m(plan, 4);
  m.add_request(RequestId{1}, tokens(30));
  ASSERT_EQ(m.admit(RequestId{1}, 4), 0);  // 30 + 4 look-ahead: 3 blocks
  EXPECT_EQ(m.block_table(RequestId{1}, 0).size(), 3u);
  m.commit(RequestId{1}, 30, std::vector<TokenId>{77});
  // Verify 1 + 4 drafts, accept 1 draft plus a bonus: computed moves 2, not 5.
  ASSERT_TRUE(m.allocate(RequestId{1}, 1, 4));
  m.commit(RequestId{1}, 2, std::vector<TokenId>{78, 79}, 1);
  EXPECT_EQ(m.num_computed(RequestId{1}), 32);
  EXPECT_EQ(m.check_invariants(), "");  // nothing cached past the 32 verified tokens
  // The look-ahead slots of the rejected drafts are still there for the next step.
  ASSERT_TRUE(m.allocate(RequestId{1}, 1, 4));
  EXPECT_EQ(m.block_table(RequestId{1}, 0).size(), 3u);
}

TEST(KvCacheManager, SlidingGroupsFreeBlocksOnlyOnceOutOfTheWindow) {
  const auto desc = testing::describe_builtin("gpt-oss-20b");  // window 128
  const auto plan = small_plan(desc, plan::Policy::kVllm, 400);
  const int sliding = group_of(plan, plan::Behaviour::kSliding);
  KvCacheManager m(plan, 0);
  m.add_request(RequestId{1}, tokens(400));
  ASSERT_EQ(m.admit(RequestId{1}, 0), 0);
  m.commit(RequestId{1}, 400, std::vector<TokenId>{9});
  const auto table = m.block_table(RequestId{1}, sliding);
  // The next query (position 400) sees 273..400: blocks before 273 / 16 = 17 are dropped.
  for (std::size_t i = 0; i < table.size(); ++i) EXPECT_EQ(table[i].is_null(), i < 17) << i;
  EXPECT_EQ(m.check_invariants(), "");
}

TEST(KvCacheManager, HitOnAFullPlusSlidingModelIsValidForBothGroups) {
  const auto desc = testing::describe_builtin("gpt-oss-20b", "eagle3-gpt-oss-20b");
  const auto plan = small_plan(desc, plan::Policy::kMixkv, 600);
  KvCacheManager m(plan, desc.num_spec_tokens);
  m.add_request(RequestId{1}, tokens(700));
  ASSERT_TRUE(m.admit(RequestId{1}, desc.num_spec_tokens).has_value());
  m.commit(RequestId{1}, 700, std::vector<TokenId>{1});
  m.add_request(RequestId{2}, tokens(700));
  const std::int64_t hit = *m.admit(RequestId{2}, desc.num_spec_tokens);
  EXPECT_GT(hit, 600);
  for (const auto& g : plan.groups)
    EXPECT_EQ(hit % g.block_size, 0) << "hit not aligned to group " << g.id;
  EXPECT_EQ(m.check_invariants(), "");
}

TEST(KvCacheManager, RecurrentGroupsHoldTheLiveStatePlusOneCheckpointPerDraft) {
  model::DescribeOptions d;
  d.num_spec_tokens = 3;
  const auto desc = testing::describe_builtin("qwen3-next-80b-a3b", {}, d);
  const auto plan = small_plan(desc, plan::Policy::kVllm, 400);
  const int gdn = group_of(plan, plan::Behaviour::kRecurrent);
  ManagerOptions no_caching;
  no_caching.enable_prefix_caching = false;
  KvCacheManager plain(plan, 3, no_caching);
  plain.add_request(RequestId{1}, tokens(50));
  ASSERT_EQ(plain.admit(RequestId{1}, 3), 0);
  EXPECT_EQ(plain.block_table(RequestId{1}, gdn).size(), 4u);  // live + 3 checkpoints
  EXPECT_EQ(plain.snapshot_interval(), 0);

  KvCacheManager m(plan, 3);
  m.add_request(RequestId{1}, tokens(50));
  ASSERT_EQ(m.admit(RequestId{1}, 3), 0);
  // With prefix caching too: 53 tokens reach no snapshot boundary, so no block for one.
  ASSERT_GT(m.snapshot_interval(), 53);
  ASSERT_EQ(m.block_table(RequestId{1}, gdn).size(), 4u);
  m.commit(RequestId{1}, 50, std::vector<TokenId>{5});
  const BlockId checkpoint2 = m.block_table(RequestId{1}, gdn)[2];
  ASSERT_TRUE(m.allocate(RequestId{1}, 1, 3));
  m.commit(RequestId{1}, 3, std::vector<TokenId>{6, 7, 8}, 2);  // 2 drafts accepted
  EXPECT_EQ(m.block_table(RequestId{1}, gdn)[0], checkpoint2);  // its state is now the live one
  EXPECT_EQ(m.check_invariants(), "");
}

// qwen3-next under vLLM's policy: attention blocks of 272 tokens, so snapshots every 272.
struct RecurrentFixture {
  model::ModelDesc desc;
  plan::CachePlan plan;
  int gdn = -1;
  explicit RecurrentFixture(int k = 0) {
    model::DescribeOptions d;
    d.num_spec_tokens = k;
    d.tp = 4;
    desc = testing::describe_builtin("qwen3-next-80b-a3b", {}, d);
    plan = small_plan(desc, plan::Policy::kVllm, 400);
    gdn = group_of(plan, plan::Behaviour::kRecurrent);
  }
};

TEST(KvCacheManager, RecurrentPrefixHitRestoresTheLatestKeptSnapshot) {
  const RecurrentFixture f;
  KvCacheManager m(f.plan, 0);
  ASSERT_EQ(m.snapshot_interval(), 272);
  m.add_request(RequestId{1}, tokens(700));
  ASSERT_EQ(m.admit(RequestId{1}, 0), 0);
  // The prefill crosses 272 and 544: the state after 544 tokens is the one kept.
  const RecurrentStep prefill = m.recurrent_step(RequestId{1}, f.gdn);
  EXPECT_TRUE(prefill.restore_from.is_null());
  EXPECT_EQ(prefill.snapshot_at, 544);
  EXPECT_EQ(prefill.snapshot, m.block_table(RequestId{1}, f.gdn).back());
  m.commit(RequestId{1}, 700, std::vector<TokenId>{5});
  EXPECT_EQ(m.pool().cached_group(prefill.snapshot), GroupId{f.gdn});
  EXPECT_TRUE(m.pool().is_free(prefill.snapshot));  // kept in the cached tail, held by no one
  EXPECT_EQ(m.block_table(RequestId{1}, f.gdn).size(), 1u);  // the live state alone
  ASSERT_TRUE(m.allocate(RequestId{1}, 1, 0));
  EXPECT_EQ(m.block_table(RequestId{1}, f.gdn).size(), 1u);  // 702 reaches no boundary
  EXPECT_EQ(m.check_invariants(), "");

  auto prompt = tokens(700);
  prompt.resize(650);  // shares 650 tokens: the snapshot at 544 is the latest before them
  prompt.push_back(99999);
  m.add_request(RequestId{2}, prompt);
  EXPECT_EQ(m.find_prefix_hit(RequestId{2}), 544);
  ASSERT_EQ(m.admit(RequestId{2}, 0), 544);
  const RecurrentStep restored = m.recurrent_step(RequestId{2}, f.gdn);
  EXPECT_EQ(restored.restore_from, prefill.snapshot);
  EXPECT_EQ(m.pool().ref_count(prefill.snapshot), 1);  // held until the prefill has copied it
  EXPECT_EQ(restored.snapshot_at, 0);                  // no boundary in 544..651
  EXPECT_EQ(m.check_invariants(), "");
  m.commit(RequestId{2}, static_cast<std::int64_t>(prompt.size()) - 544, std::vector<TokenId>{1});
  EXPECT_TRUE(m.recurrent_step(RequestId{2}, f.gdn).restore_from.is_null());
  EXPECT_EQ(m.pool().ref_count(prefill.snapshot), 0);
  EXPECT_EQ(m.check_invariants(), "");
  for (const auto& s : m.stats()) {
    if (s.group == f.gdn) {
      EXPECT_EQ(s.hit_tokens, 544);
    }
  }
}

TEST(KvCacheManager, RecurrentSnapshotInDraftsIsKeptOnlyOnceAccepted) {
  const RecurrentFixture f(3);
  KvCacheManager m(f.plan, 3);
  const std::int64_t c = m.snapshot_interval();
  ASSERT_GT(c, 4);
  m.add_request(RequestId{1}, tokens(c - 2));
  ASSERT_EQ(m.admit(RequestId{1}, 3), 0);
  // c - 2 + 3 look-ahead passes c, but only c - 2 are sure: the first boundary, among the drafts.
  EXPECT_EQ(m.recurrent_step(RequestId{1}, f.gdn).snapshot_at, c);
  m.commit(RequestId{1}, c - 2, std::vector<TokenId>{5});  // c - 2 computed: not kept
  ASSERT_EQ(m.block_table(RequestId{1}, f.gdn).size(), 5u);
  ASSERT_TRUE(m.allocate(RequestId{1}, 1, 3));  // tokens c-2 .. c+1: c is after draft 1
  const RecurrentStep step = m.recurrent_step(RequestId{1}, f.gdn);
  EXPECT_EQ(step.snapshot_at, c);
  m.commit(RequestId{1}, 1, std::vector<TokenId>{6}, 0);  // every draft rejected: c - 1 computed
  EXPECT_FALSE(m.pool().cached_hash(step.snapshot).has_value());
  ASSERT_TRUE(m.allocate(RequestId{1}, 1, 3));
  EXPECT_EQ(m.recurrent_step(RequestId{1}, f.gdn).snapshot_at, c);  // asked for again
  m.commit(RequestId{1}, 3, std::vector<TokenId>{7, 8, 9}, 2);      // c + 2 computed
  EXPECT_EQ(m.pool().cached_group(step.snapshot), GroupId{f.gdn});
  EXPECT_EQ(m.check_invariants(), "");
}

TEST(KvCacheManager, DrafterDoesNotShortenARecurrentHybridHit) {
  const RecurrentFixture f(3);
  std::vector<std::int64_t> hits;
  for (int k : {0, 3}) {
    KvCacheManager m(f.plan, k);
    m.add_request(RequestId{1}, tokens(900));
    ASSERT_TRUE(m.admit(RequestId{1}, k).has_value());
    m.commit(RequestId{1}, 900, std::vector<TokenId>{5});
    m.add_request(RequestId{2}, tokens(900));
    hits.push_back(*m.admit(RequestId{2}, k));
    // The prefill keeps the latest boundary before 900; the second request hits exactly there.
    EXPECT_EQ(hits.back(), 899 / m.snapshot_interval() * m.snapshot_interval());
  }
  EXPECT_GT(hits[0], 0);
  EXPECT_EQ(hits[0], hits[1]);  // the drafter costs no block
}

TEST(KvCacheManager, SnapshotIntervalMustAlignWithEveryAttentionBlock) {
  const RecurrentFixture f;
  ManagerOptions o;
  o.snapshot_interval = 544;
  EXPECT_EQ(KvCacheManager(f.plan, 0, o).snapshot_interval(), 544);
  o.snapshot_interval = 300;
  testing::expect_error([&] { KvCacheManager(f.plan, 0, o); }, ErrorCode::kInvalidInput,
                        {"snapshot_interval 300", "group 3", "272"});
  KvCacheManager m(f.plan, 0);
  m.add_request(RequestId{1}, tokens(10));
  testing::expect_error([&] { (void)m.recurrent_step(RequestId{1}, 3); }, ErrorCode::kInvalidInput,
                        {"group 3", "not a recurrent"});
}

TEST(KvCacheManager, StatsCountBlocksPaddingAndHits) {
  const auto desc = testing::describe_builtin("qwen3-next-80b-a3b");
  const auto plan = small_plan(desc, plan::Policy::kVllm, 400);
  KvCacheManager m(plan, 0);
  m.add_request(RequestId{1}, tokens(600));
  ASSERT_TRUE(m.admit(RequestId{1}, 0).has_value());
  std::int64_t held = 0, padding = 0;
  for (const auto& s : m.stats()) {
    held += s.blocks_held;
    padding += s.padding_bytes;
  }
  EXPECT_EQ(held, m.pool().num_used() + 0);
  EXPECT_GT(padding, 0);  // GDN pages are padded to the attention page under vLLM's policy
}

TEST(KvCacheManager, BadCallsAreClearErrors) {
  const auto desc = testing::describe_builtin("llama-3.1-8b");
  KvCacheManager m(small_plan(desc, plan::Policy::kVllm, 100, 1024), 0);
  testing::expect_error([&] { m.add_request(RequestId{1}, {}); }, ErrorCode::kInvalidInput,
                        {"empty prompt"});
  m.add_request(RequestId{1}, tokens(10));
  testing::expect_error([&] { m.add_request(RequestId{1}, tokens(10)); }, ErrorCode::kInvalidInput,
                        {"already exists"});
  testing::expect_error([&] { m.free(RequestId{9}); }, ErrorCode::kInvalidInput, {"no request 9"});
  ASSERT_TRUE(m.admit(RequestId{1}, 0).has_value());
  testing::expect_error([&] { m.commit(RequestId{1}, 40, std::vector<TokenId>{1}); },
                        ErrorCode::kInvalidInput, {"only 11 are known"});
}

// Random admissions with shared prefixes, speculative steps with random acceptance, frees and
// preemptions on three kinds of plan; every invariant after every operation.
TEST(KvCacheManagerProperty, RandomSpeculativeWorkloadsKeepEveryInvariant) {
  struct Case {
    const char* target;
    std::optional<std::string_view> draft;
    plan::Policy policy;
  };
  for (const Case& c : {Case{"gpt-oss-20b", "eagle3-gpt-oss-20b", plan::Policy::kMixkv},
                        Case{"qwen3-next-80b-a3b", std::nullopt, plan::Policy::kVllm},
                        Case{"gemma-3-27b", std::nullopt, plan::Policy::kMixkv},
                        Case{"llama-3.1-8b", "eagle3-llama-3.1-8b", plan::Policy::kVllm}}) {
    SCOPED_TRACE(c.target);
    model::DescribeOptions d;
    d.num_spec_tokens = 3;
    const auto desc = testing::describe_builtin(c.target, c.draft, d);
    const auto plan = small_plan(desc, c.policy, 300, 1024);
    KvCacheManager m(plan, 3);
    std::mt19937_64 rng(42);
    auto pick = [&](std::int64_t lo, std::int64_t hi) {
      return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
    };
    std::vector<std::int64_t> running;
    std::int64_t next_id = 1, failed = 0, hits = 0;
    for (int op = 0; op < 1500; ++op) {
      const auto choice = pick(0, 9);
      if (choice < 3 || running.empty()) {
        // Admit: prompts share one of three prefixes.
        auto prompt =
            tokens(pick(16, 300) * (1 + pick(0, 1)), static_cast<TokenId>(1000 * pick(0, 2)));
        const RequestId id{next_id++};
        m.add_request(id, prompt);
        const auto free_before = m.pool().num_free();
        auto hit = m.admit(id, 3);
        if (!hit) {
          ++failed;
          EXPECT_EQ(m.pool().num_free(), free_before);
          m.free(id);
        } else {
          hits += *hit > 0;
          m.commit(id, static_cast<std::int64_t>(prompt.size()) - *hit, std::vector<TokenId>{7});
          running.push_back(id.value());
        }
      } else if (choice < 8) {
        // A speculative step: verify the last token + 3 drafts, accept some.
        const RequestId id{running[static_cast<std::size_t>(
            pick(0, static_cast<std::int64_t>(running.size()) - 1))]};
        if (m.allocate(id, 1, 3)) {
          const int accepted = static_cast<int>(pick(0, 3));
          std::vector<TokenId> out(static_cast<std::size_t>(accepted + 1), 11);
          m.commit(id, 1 + accepted, out, accepted);
        } else {
          ++failed;  // preempt by recompute: drop the request
          m.free(id);
          std::erase(running, id.value());
        }
      } else {
        const auto idx =
            static_cast<std::size_t>(pick(0, static_cast<std::int64_t>(running.size()) - 1));
        m.free(RequestId{running[idx]});
        running.erase(running.begin() + static_cast<std::ptrdiff_t>(idx));
      }
      const std::string broken = m.check_invariants();
      ASSERT_EQ(broken, "") << "after operation " << op;
    }
    for (auto id : running) m.free(RequestId{id});
    EXPECT_EQ(m.pool().num_used(), 0);
    EXPECT_GT(failed, 0);  // the pool was really under pressure
    // Prefixes were shared wherever blocks (and recurrent snapshots) are small enough for these
    // prompts to fill them.
    std::int64_t largest_block = 0;
    for (const auto& g : plan.groups) {
      if (g.behaviour != plan::Behaviour::kRecurrent)
        largest_block = std::max(largest_block, g.block_size);
    }
    if (largest_block <= 128) {
      EXPECT_GT(hits, 0);
    }
  }
}

}  // namespace
}  // namespace mixkv::cache
