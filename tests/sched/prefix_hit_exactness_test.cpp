// Prefix hits on hybrid models are exact: a request that takes a hit ends up with the same bytes
// in every slot its kernels read — K/V rows through the planned geometry, recurrent states — as
// the same request recomputed from scratch in a second manager and cache, and paged attention
// over both gives bit-identical outputs. The "model" is deterministic: K/V of a token are a
// function of (layer, position, token), a recurrent state is a fold over the tokens (the real
// recurrent kernels come later; what is tested here is where the manager says states live). The
// one scheduler drives both managers, with the test's engine as its model and drafter.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>

#include "mixkv/attn/attention_groups.hpp"
#include "mixkv/cache/kv_cache_manager.hpp"
#include "mixkv/kernels/attention_kernel.hpp"
#include "mixkv/layout/geometry.hpp"
#include "mixkv/sched/scheduler.hpp"
#include "test_support.hpp"

namespace mixkv::cache {
namespace {

using mixkv::testing::kMiB;

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// A state of eight lanes; its bytes in a block are the lanes, repeated.
using Lanes = std::array<std::uint64_t, 8>;

// A manager over a real cache of the plan's tensors, driven by the one scheduler: the engine is
// its model (it writes K/V and folds states as a model would) and its drafter, and the test
// scripts each step's drafts, how many are accepted and the token sampled. Requests are named by
// the test's ids; rid() gives the manager's.
class Engine final : public sched::Model, public spec::Drafter {
 public:
  Engine(const model::ModelDesc& desc, const plan::CachePlan& plan, int k)
      : desc_(desc), plan_(plan), k_(k), manager_(plan, k), sched_(manager_, plan, options(k)) {
    groups_ = attn::build_attention_groups(desc_, plan_);
    geometry_ = layout::make_geometry(desc_, plan_, groups_);
    for (const auto& t : plan_.tensors) {
      // 0xFF is NaN in every float dtype: reading a slot nobody wrote poisons the output.
      tensors_.emplace_back(static_cast<std::size_t>(t.bytes), std::byte{0xFF});
    }
  }

  const KvCacheManager& manager() const { return manager_; }
  RequestId rid(RequestId id) const {
    return RequestId{static_cast<std::int64_t>(index_.at(id.value()))};
  }
  std::vector<TokenId> tokens(RequestId id) const {
    const auto t = sched_.tokens(index_.at(id.value()));
    return {t.begin(), t.end()};
  }
  const layout::Geometry& geometry() const { return geometry_; }

  // Queues `prompt`; one step admits it, computes what the hit does not cover and commits it
  // with `first` sampled. A request of one token to generate finishes there (its blocks go to
  // the free queue, cached). Returns the hit.
  std::int64_t prefill(RequestId id, const std::vector<TokenId>& prompt, TokenId first,
                       std::int64_t max_tokens = 1 << 20) {
    const std::size_t i = sched_.add({prompt, max_tokens, fmt_id(id)});
    index_[id.value()] = i;
    script_[i] = {{}, 0, first};
    sched_.step(*this, this);
    return sched_.stats(i).prefix_hit_tokens;
  }

  // One speculative step of every running request: request `id` verifies its last token plus
  // `drafts`, of which `accepted` are accepted, then `bonus` is sampled.
  void decode(RequestId id, const std::vector<TokenId>& drafts, int accepted, TokenId bonus) {
    ASSERT_EQ(static_cast<int>(drafts.size()), k_);
    script_[index_.at(id.value())] = {drafts, accepted, bonus};
    sched_.step(*this, this);
  }

  // spec::Drafter: the scripted drafts (none for a request the step does not script).
  std::string name() const override { return "scripted"; }
  std::vector<TokenId> propose(const spec::DraftContext& ctx, int) override {
    const auto it = script_.find(ctx.request);
    return it == script_.end() ? std::vector<TokenId>{} : it->second.drafts;
  }

  // sched::Model: computes every work, picks the scripted tokens.
  std::int64_t vocab_size() const override { return std::int64_t{1} << 30; }
  sched::ModelOutput forward(std::span<const sched::Work> batch) override {
    sched::ModelOutput out;
    for (const sched::Work& w : batch) {
      compute(w, w.prefill ? 0 : k_);
      const auto n = static_cast<std::int64_t>(w.tokens.size());
      const auto it = script_.find(w.request);
      const Script s = it == script_.end() ? Script{{}, 0, 1} : it->second;
      if (it != script_.end()) script_.erase(it);
      for (std::int64_t i = 0; i < n; ++i) {
        if (w.prefill) {
          out.picks.push_back(i + 1 == n ? s.sampled : 0);
        } else {
          out.picks.push_back(i < s.accepted ? w.tokens[static_cast<std::size_t>(i + 1)]
                                             : s.sampled);
        }
      }
    }
    return out;
  }

  std::vector<std::int64_t> blocks(RequestId id, int group) const {
    std::vector<std::int64_t> out;
    for (BlockId b : manager_.block_table(id, group)) out.push_back(b.value());
    return out;
  }

  std::span<const std::byte> bytes(int tensor, std::int64_t offset, std::int64_t length) const {
    return std::span<const std::byte>(tensors_[static_cast<std::size_t>(tensor)])
        .subspan(static_cast<std::size_t>(offset), static_cast<std::size_t>(length));
  }

  std::span<const std::byte> state(const layout::LayerGeometry& l, BlockId block) const {
    return bytes(l.tensor, l.offset + block.value() * l.kernel_page_stride, l.state_bytes);
  }

  // Attention of one query (the last computed token's) of request `id` in layer `l`.
  std::vector<float> attend(const layout::LayerGeometry& l, RequestId id) const {
    const auto& g = groups_[static_cast<std::size_t>(l.attention_group)];
    const kernels::AttentionSpec spec = kernels::attention_spec(g.params, layer_desc(l.layer));
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> query(static_cast<std::size_t>(spec.params.num_q_heads * spec.head_size));
    for (float& q : query) q = dist(rng);
    std::vector<float> sinks;
    if (spec.params.sinks) sinks.assign(static_cast<std::size_t>(spec.params.num_q_heads), 0.5f);
    const auto pages = layout::kernel_block_table(l, blocks(id, l.kv_cache_group));
    const kernels::PagedSequence seq{pages, manager_.num_computed(id), 1};
    kernels::AttentionInputs in;
    in.cache = tensors_[static_cast<std::size_t>(l.tensor)];
    in.batch = std::span<const kernels::PagedSequence>(&seq, 1);
    in.queries = query;
    in.sinks = sinks;
    std::vector<float> out(static_cast<std::size_t>(spec.params.num_q_heads * spec.head_size_v));
    kernels::paged_attention(spec, l, in, out);
    return out;
  }

 private:
  const model::LayerDesc& layer_desc(const std::string& name) const {
    for (const auto& l : desc_.layers) {
      if (l.name == name) return l;
    }
    throw std::runtime_error("no layer " + name);
  }

  static float kv_value(std::size_t layer, std::int64_t position, TokenId token, std::int64_t e) {
    const std::uint64_t h =
        mix(layer * 0x100000001B3ULL ^ mix(static_cast<std::uint64_t>(position * 131 + token)) ^
            static_cast<std::uint64_t>(e));
    return static_cast<float>(static_cast<std::int64_t>(h % 2001) - 1000) / 1000.0f;
  }

  static Lanes step_state(Lanes s, TokenId token, std::int64_t position) {
    for (std::size_t i = 0; i < s.size(); ++i)
      s[i] = mix(s[i] ^ (static_cast<std::uint64_t>(token) << 20) ^
                 static_cast<std::uint64_t>(position) ^ (i << 56));
    return s;
  }

  void write_state(const layout::LayerGeometry& l, BlockId block, const Lanes& s) {
    ASSERT_FALSE(block.is_null());
    std::byte* out = tensors_[static_cast<std::size_t>(l.tensor)].data() + l.offset +
                     block.value() * l.kernel_page_stride;
    // The lanes, repeated over the whole state (doubling copies: states are up to megabytes).
    const auto n = static_cast<std::size_t>(l.state_bytes);
    std::memcpy(out, s.data(), std::min(n, sizeof(s)));
    for (std::size_t done = sizeof(s); done < n; done *= 2)
      std::memcpy(out + done, out, std::min(done, n - done));
  }

  Lanes read_state(const layout::LayerGeometry& l, BlockId block) const {
    Lanes s;
    std::memcpy(s.data(), state(l, block).data(), sizeof(s));
    return s;
  }

  // Computes tokens `seq` at positions first.. in every layer: K/V written through the slot
  // mapping; recurrent states folded from the live state (restored first after a hit) into the
  // live slot and the checkpoints, and copied into the snapshot block at the boundary the manager
  // asks for. `drafts` > 0: a speculative step (checkpoint j = state after seq[j]).
  void compute(const sched::Work& w, int drafts) {
    const std::int64_t first = w.start;
    const std::span<const TokenId> seq = w.tokens;
    const auto count = static_cast<std::int64_t>(seq.size());
    const auto group_of = [](const layout::LayerGeometry& l) {
      return static_cast<std::size_t>(l.kv_cache_group);
    };
    for (std::size_t li = 0; li < geometry_.layers.size(); ++li) {
      const layout::LayerGeometry& l = geometry_.layers[li];
      if (l.recurrent) {
        const RecurrentStep step = w.recurrent.at(group_of(l));
        const auto table = w.block_tables.at(group_of(l));
        const BlockId live = table[0];
        Lanes s{};
        if (!step.restore_from.is_null()) {
          const auto from = state(l, step.restore_from);
          std::memcpy(tensors_[static_cast<std::size_t>(l.tensor)].data() + l.offset +
                          live.value() * l.kernel_page_stride,
                      from.data(), from.size());
        }
        if (first > 0) s = read_state(l, live);
        for (std::int64_t j = 0; j < count; ++j) {
          s = step_state(s, seq[static_cast<std::size_t>(j)], first + j);
          if (drafts > 0) write_state(l, table[static_cast<std::size_t>(j)], s);
          if (first + j + 1 == step.snapshot_at) write_state(l, step.snapshot, s);
        }
        if (drafts == 0) write_state(l, live, s);
        continue;
      }
      const auto& g = groups_[static_cast<std::size_t>(l.attention_group)];
      const kernels::AttentionSpec spec = kernels::attention_spec(g.params, layer_desc(l.layer));
      std::vector<std::int64_t> table;
      for (BlockId b : w.block_tables.at(group_of(l))) table.push_back(b.value());
      // A sliding group may have dropped blocks the prefill would write to: write only those
      // held (the kernels never read the others).
      std::vector<std::int64_t> slots;
      std::vector<float> k, v;
      const std::int64_t kn = kernels::k_row_elements(spec), vn = kernels::v_row_elements(spec);
      for (std::int64_t j = 0; j < count; ++j) {
        const std::int64_t p = first + j;
        if (table[static_cast<std::size_t>(p / l.block_tokens)] == 0) continue;
        slots.push_back(kernels::slot_mapping(l, table, p, 1)[0]);
        for (std::int64_t e = 0; e < kn; ++e)
          k.push_back(kv_value(li, p, seq[static_cast<std::size_t>(j)], e));
        for (std::int64_t e = 0; e < vn; ++e)
          v.push_back(kv_value(li, p, seq[static_cast<std::size_t>(j)], kn + e));
      }
      kernels::write_kv(spec, l, {}, tensors_[static_cast<std::size_t>(l.tensor)], slots, k, v);
    }
  }

  struct Script {
    std::vector<TokenId> drafts;
    int accepted = 0;
    TokenId sampled = 0;
  };
  static sched::SchedulerOptions options(int k) {
    sched::SchedulerOptions o;
    o.num_spec_tokens = k;
    o.prefill_chunk = 0;  // whole prompts, as the test computes them
    o.cap_drafts = false;
    // Both runs must draft alike: a fixed cost, not their own timings, sets the draft lengths.
    o.step_cost = std::make_shared<sched::LinearStepCost>(1.0, 0.1);
    return o;
  }
  static std::string fmt_id(RequestId id) { return "request " + std::to_string(id.value()); }

  model::ModelDesc desc_;
  plan::CachePlan plan_;
  int k_;
  KvCacheManager manager_;
  sched::Scheduler sched_;
  std::vector<attn::AttentionGroup> groups_;
  layout::Geometry geometry_;
  std::vector<std::vector<std::byte>> tensors_;
  std::map<std::int64_t, std::size_t> index_;  // the test's id -> the scheduler's request
  std::map<std::size_t, Script> script_;       // the step's scripted requests
};

bool same_bytes(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

// Request `x_id` of `x` (which took a hit) against request `y_id` of `y` (computed from scratch):
// every K/V row its kernels can read, every live recurrent state, and paged attention outputs.
void expect_same_cache(const Engine& x, RequestId x_id, const Engine& y, RequestId y_id) {
  ASSERT_EQ(x.manager().num_computed(x_id), y.manager().num_computed(y_id));
  const std::int64_t n = x.manager().num_computed(x_id);
  std::int64_t rows = 0, states = 0;
  for (const auto& l : x.geometry().layers) {
    const auto xt = x.blocks(x_id, l.kv_cache_group);
    const auto yt = y.blocks(y_id, l.kv_cache_group);
    if (l.recurrent) {
      EXPECT_TRUE(same_bytes(x.state(l, BlockId(static_cast<std::int32_t>(xt[0]))),
                             y.state(l, BlockId(static_cast<std::int32_t>(yt[0])))))
          << "live state of " << l.layer;
      ++states;
      continue;
    }
    ASSERT_EQ(xt.size(), yt.size()) << l.layer;
    for (std::int64_t p = 0; p < n; ++p) {
      const auto b = static_cast<std::size_t>(p / l.block_tokens);
      ASSERT_EQ(xt[b] == 0, yt[b] == 0) << l.layer << " block " << b;
      if (xt[b] == 0) continue;  // out of the window in both
      const auto xl = layout::locate_token(l, xt, p);
      const auto yl = layout::locate_token(l, yt, p);
      ASSERT_TRUE(same_bytes(x.bytes(l.tensor, xl.k_offset, l.k_token_bytes),
                             y.bytes(l.tensor, yl.k_offset, l.k_token_bytes)))
          << l.layer << " K of token " << p;
      ASSERT_TRUE(same_bytes(x.bytes(l.tensor, xl.v_offset, l.v_token_bytes),
                             y.bytes(l.tensor, yl.v_offset, l.v_token_bytes)))
          << l.layer << " V of token " << p;
      ++rows;
    }
    const auto xo = x.attend(l, x_id);
    const auto yo = y.attend(l, y_id);
    for (float f : xo) ASSERT_TRUE(std::isfinite(f)) << l.layer << " read a slot nobody wrote";
    EXPECT_EQ(std::memcmp(xo.data(), yo.data(), xo.size() * sizeof(float)), 0)
        << "attention output of " << l.layer;
  }
  EXPECT_GT(rows, 0);
  (void)states;
}

std::vector<TokenId> iota_tokens(std::int64_t n, TokenId start) {
  std::vector<TokenId> t(static_cast<std::size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

plan::CachePlan plan_for(const model::ModelDesc& desc, plan::Policy policy, std::int64_t memory) {
  plan::PlanOptions o;
  o.policy = policy;
  o.memory_bytes = memory;
  o.max_model_len = 2048;
  o.request_len = 1024;
  return plan::make_plan(desc, o);
}

// The hit B takes after A in a bare manager with `k` speculative tokens.
std::int64_t hit_only(const plan::CachePlan& plan, int k, std::int64_t a_len, std::int64_t shared) {
  KvCacheManager m(plan, k);
  const auto a = iota_tokens(a_len, 1);
  auto b = std::vector<TokenId>(a.begin(), a.begin() + shared);
  b.push_back(99999);
  m.add_request(RequestId{1}, a);
  EXPECT_TRUE(m.admit(RequestId{1}, k).has_value());
  m.commit(RequestId{1}, a_len, std::vector<TokenId>{7});
  m.add_request(RequestId{2}, b);
  return m.admit(RequestId{2}, k).value_or(-1);
}

// The least common multiple of the attention groups' block sizes: a hit valid for all of them
// is a multiple of it.
std::int64_t common_block(const plan::CachePlan& plan) {
  std::int64_t l = 1;
  for (const auto& g : plan.groups) {
    if (g.behaviour != plan::Behaviour::kRecurrent) l = std::lcm(l, g.block_size);
  }
  return l;
}

// Runs A (`a_len` tokens) then B (the first `shared` tokens of A, then its own) in one engine,
// B alone in another, with `steps` speculative steps each, and compares B in both.
void run_shared_prefix_case(const model::ModelDesc& desc, const plan::CachePlan& plan, int k,
                            std::int64_t a_len, std::int64_t shared, int steps,
                            std::int64_t* hit_out) {
  Engine x(desc, plan, k), y(desc, plan, k);
  const auto a = iota_tokens(a_len, 1);
  auto b = std::vector<TokenId>(a.begin(), a.begin() + shared);
  const auto own = iota_tokens(37, 50000);
  b.insert(b.end(), own.begin(), own.end());
  // A generates one token and finishes: B's hit comes from blocks waiting, cached, in the free
  // queue.
  ASSERT_EQ(x.prefill(RequestId{1}, a, 7, 1), 0);
  ASSERT_EQ(x.manager().num_requests(), 0u);
  const std::int64_t hit = x.prefill(RequestId{2}, b, 8);
  ASSERT_EQ(y.prefill(RequestId{2}, b, 8), 0);
  EXPECT_GT(hit, 0);
  *hit_out = hit;
  expect_same_cache(x, x.rid(RequestId{2}), y, y.rid(RequestId{2}));
  std::mt19937 rng(3);
  for (int s = 0; s < steps; ++s) {
    std::vector<TokenId> drafts;
    for (int d = 0; d < k; ++d) drafts.push_back(static_cast<TokenId>(60000 + 10 * s + d));
    const int accepted = k == 0 ? 0 : static_cast<int>(rng() % static_cast<unsigned>(k + 1));
    x.decode(RequestId{2}, drafts, accepted, 70000 + s);
    y.decode(RequestId{2}, drafts, accepted, 70000 + s);
  }
  expect_same_cache(x, x.rid(RequestId{2}), y, y.rid(RequestId{2}));
  EXPECT_EQ(x.manager().check_invariants(), "");
  EXPECT_EQ(y.manager().check_invariants(), "");
}

TEST(PrefixHitExactness, FullPlusSlidingWithADrafterMatchesRecomputation) {
  const auto desc = testing::describe_builtin("gpt-oss-20b", "eagle3-gpt-oss-20b");
  ASSERT_EQ(desc.num_spec_tokens, 3);
  const auto plan = plan_for(desc, plan::Policy::kMixkv, 64 * kMiB);
  std::int64_t hit = 0;
  run_shared_prefix_case(desc, plan, 3, 700, 600, 12, &hit);
  // The last boundary of every group within the shared tokens: nothing lost to the drafter.
  EXPECT_EQ(hit, 600 / common_block(plan) * common_block(plan));
  EXPECT_EQ(hit_only(plan, 0, 700, 600), hit);
}

TEST(PrefixHitExactness, FullPlusRecurrentMatchesRecomputation) {
  model::DescribeOptions d;
  d.tp = 4;
  const auto desc = testing::describe_builtin("qwen3-next-80b-a3b", {}, d);
  const auto plan = plan_for(desc, plan::Policy::kVllm, 128 * kMiB);
  std::int64_t hit = 0;
  run_shared_prefix_case(desc, plan, 0, 700, 650, 5, &hit);
  EXPECT_EQ(hit, 650 / KvCacheManager(plan, 0).snapshot_interval() *
                     KvCacheManager(plan, 0).snapshot_interval());
}

TEST(PrefixHitExactness, FullPlusRecurrentWithADrafterMatchesRecomputation) {
  model::DescribeOptions d;
  d.tp = 4;
  d.num_spec_tokens = 3;
  const auto desc = testing::describe_builtin("qwen3.5-27b", "mtp", d);
  const auto plan = plan_for(desc, plan::Policy::kVllm, 512 * kMiB);
  std::int64_t hit = 0;
  run_shared_prefix_case(desc, plan, 3, 1700, 1650, 8, &hit);
  EXPECT_EQ(hit_only(plan, 0, 1700, 1650), hit);  // no block lost to the drafter
  EXPECT_EQ(hit, 1650 / KvCacheManager(plan, 3).snapshot_interval() *
                     KvCacheManager(plan, 3).snapshot_interval());
}

// A snapshot written during speculative decode steps (not a prefill) serves a later hit exactly.
TEST(PrefixHitExactness, SnapshotKeptByDecodeStepsServesALaterHit) {
  model::DescribeOptions d;
  d.tp = 4;
  d.num_spec_tokens = 3;
  const auto desc = testing::describe_builtin("qwen3-next-80b-a3b", {}, d);
  const auto plan = plan_for(desc, plan::Policy::kVllm, 128 * kMiB);
  Engine x(desc, plan, 3), y(desc, plan, 3);
  const std::int64_t c = x.manager().snapshot_interval();
  ASSERT_GT(c, 8);
  // A's prompt ends just before the boundary c: only decode steps cross it.
  const auto prompt = iota_tokens(c - 3, 1);
  ASSERT_EQ(x.prefill(RequestId{1}, prompt, 5), 0);
  std::mt19937 rng(11);
  for (int s = 0; x.manager().num_computed(x.rid(RequestId{1})) < c + 8; ++s) {
    std::vector<TokenId> drafts = {100 + s, 200 + s, 300 + s};
    x.decode(RequestId{1}, drafts, static_cast<int>(rng() % 4), 400 + s);
  }
  // B shares A's verified tokens past c: its hit is c, restored from the decode-step snapshot.
  std::vector<TokenId> b = x.tokens(RequestId{1});
  b.resize(static_cast<std::size_t>(c + 5));
  const std::int64_t hit = x.prefill(RequestId{2}, b, 9);
  EXPECT_EQ(hit, c);
  ASSERT_EQ(y.prefill(RequestId{2}, b, 9), 0);
  expect_same_cache(x, x.rid(RequestId{2}), y, y.rid(RequestId{2}));
}

}  // namespace
}  // namespace mixkv::cache
