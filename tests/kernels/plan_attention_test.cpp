// Kernels over real plans of built-in models: allocate the planned tensors, write random K/V
// through each layer's slot mapping for a few requests on random blocks, run every attention
// group's kernel with its own parameters and compare with the dense reference over the logical
// sequences. Planted faults in the geometry or parameters must show up as mismatches.
#include "mixkv/kernels/attention_kernel.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <random>
#include <set>

#include "kernels/kernels_test_support.hpp"
#include "mixkv/plan/plan.hpp"
#include "test_support.hpp"

namespace mixkv::kernels {
namespace {

using mixkv::testing::kMiB;

struct Shape {
  std::int64_t kv_len = 0;
  std::int64_t num_queries = 1;
};

// One layer under test: its data written, ready to run.
struct LayerCase {
  const model::LayerDesc* desc = nullptr;
  const attn::AttentionGroup* group = nullptr;
  layout::LayerGeometry geometry;
  AttentionSpec spec;       // from the attention group's parameters: what the kernel is given
  AttentionSpec reference;  // from the layer's own parameters: the truth
  KvScales scales;
  std::vector<float> sinks;
  std::vector<testing::Request> requests;
  std::vector<std::vector<std::int64_t>> tables;  // the requests' manager blocks (0 = freed)
};

class PlanRun {
 public:
  PlanRun(std::string_view target, std::optional<std::string_view> draft, plan::Policy policy,
          std::int64_t memory, std::int64_t max_model_len, const model::DescribeOptions& d = {})
      : desc_(mixkv::testing::describe_builtin(target, draft, d)), rng_(42) {
    plan::PlanOptions o;
    o.policy = policy;
    o.memory_bytes = memory;
    o.max_model_len = max_model_len;
    plan_ = plan::make_plan(desc_, o);
    groups_ = attn::build_attention_groups(desc_, plan_);
    geometry_ = layout::make_geometry(desc_, plan_, groups_);
    free_.resize(static_cast<std::size_t>(plan_.pools.at(0).num_blocks - 1));
    std::iota(free_.begin(), free_.end(), 1);  // block 0 is the null block
    std::shuffle(free_.begin(), free_.end(), rng_);
  }

  // Writes requests of `shapes` into the first and last layer of every attention group whose
  // kernel spec and page shape were not seen yet (every layer's bytes are written before any
  // kernel runs, so layers sharing a tensor must not clobber each other).
  void prepare(const std::vector<Shape>& shapes, std::set<int> only_groups = {}) {
    std::set<std::tuple<std::string, std::int64_t, std::int64_t>> seen;
    for (const auto& g : groups_) {
      if (!only_groups.empty() && !only_groups.contains(g.id)) continue;
      std::vector<std::string> names = {g.layers.front()};
      if (g.layers.size() > 1) names.push_back(g.layers.back());
      for (const auto& name : names) {
        LayerCase c;
        for (const auto& l : desc_.layers) {
          if (l.name == name) c.desc = &l;
        }
        c.group = &g;
        c.geometry = geometry_.layer(name);
        c.spec = attention_spec(g.params, *c.desc);
        c.reference = attention_spec(attn::attention_params(*c.desc), *c.desc);
        const auto key = std::tuple{fmt_spec(c.spec), c.geometry.kernel_tokens,
                                    c.geometry.kernel_pages_per_block};
        if (name == g.layers.front() && !seen.insert(key).second) break;
        if (c.spec.params.kv_dtype == DType::kFp8E4m3 || c.spec.params.kv_dtype == DType::kFp8E5m2)
          c.scales = KvScales{0.05f, 0.02f};
        if (c.spec.params.sinks)
          c.sinks = testing::random_values(
              rng_, static_cast<std::size_t>(c.spec.params.num_q_heads), 2.0f);
        std::vector<std::byte>& tensor = tensor_(c.geometry.tensor);
        const std::vector<std::vector<std::int64_t>>& blocks =
            blocks_(c.geometry, c.reference, shapes);
        for (std::size_t r = 0; r < shapes.size(); ++r) {
          const std::int64_t first = first_kept(c.reference, c.geometry, shapes[r]);
          c.requests.push_back(testing::make_request(c.spec, c.geometry, c.scales, tensor,
                                                     blocks[r], shapes[r].kv_len,
                                                     shapes[r].num_queries, rng_, 1.0f, first));
          c.tables.push_back(blocks[r]);
        }
        cases_.push_back(std::move(c));
      }
    }
  }

  // Runs one prepared layer; `geometry` and `spec` replace the case's own (planted faults).
  testing::Comparison run(const LayerCase& c, const layout::LayerGeometry* geometry = nullptr,
                          const AttentionSpec* spec = nullptr) {
    return testing::run_and_compare(spec ? *spec : c.spec, c.reference,
                                    geometry ? *geometry : c.geometry, c.scales,
                                    tensors_.at(c.geometry.tensor), c.requests, c.tables, c.sinks);
  }

  void expect_all_match() {
    ASSERT_FALSE(cases_.empty());
    for (const LayerCase& c : cases_) {
      const testing::Comparison r = run(c);
      EXPECT_TRUE(r.ok()) << "attention group " << c.group->id << ", layer " << c.desc->name << ": "
                          << r.to_string();
    }
  }

  const std::vector<LayerCase>& cases() const { return cases_; }
  const layout::Geometry& geometry() const { return geometry_; }

 private:
  static std::string fmt_spec(const AttentionSpec& s) {
    const auto& p = s.params;
    return std::to_string(p.window_left) + "/" + std::to_string(p.soft_cap.value_or(0)) + "/" +
           std::to_string(p.scale) + "/" + std::to_string(p.sinks) + "/" +
           std::to_string(p.causal) + "/" + std::string(to_string(p.kv_dtype)) + "/" +
           std::to_string(p.num_q_heads) + "/" + std::to_string(p.num_kv_heads) + "/" +
           std::to_string(s.head_size) + "/" + std::to_string(s.head_size_v);
  }

  // The first position any query of the request can see: blocks wholly before it stay freed.
  static std::int64_t first_kept(const AttentionSpec& truth, const layout::LayerGeometry& g,
                                 const Shape& s) {
    const auto w = truth.params.window_left;
    if (w < 0) return 0;
    const std::int64_t lo = std::max<std::int64_t>(0, s.kv_len - s.num_queries - w);
    return lo / g.block_tokens * g.block_tokens;
  }

  std::vector<std::byte>& tensor_(int index) {
    auto it = tensors_.find(index);
    if (it == tensors_.end()) {
      // 0xFF is NaN in every dtype: a read of bytes nobody wrote poisons the output.
      it = tensors_
               .emplace(index, std::vector<std::byte>(
                                   static_cast<std::size_t>(plan_.tensors.at(index).bytes),
                                   std::byte{0xFF}))
               .first;
    }
    return it->second;
  }

  // One block table per request for the layer's KV-cache group, shared by all its layers; blocks
  // wholly outside every query's window get the null block.
  const std::vector<std::vector<std::int64_t>>& blocks_(const layout::LayerGeometry& g,
                                                        const AttentionSpec& truth,
                                                        const std::vector<Shape>& shapes) {
    auto it = blocks_by_group_.find(g.kv_cache_group);
    if (it != blocks_by_group_.end()) return it->second;
    std::vector<std::vector<std::int64_t>> tables;
    for (const Shape& s : shapes) {
      std::vector<std::int64_t> t;
      const std::int64_t n = (s.kv_len + g.block_tokens - 1) / g.block_tokens;
      const std::int64_t kept = first_kept(truth, g, s) / g.block_tokens;
      for (std::int64_t b = 0; b < n; ++b) {
        if (b < kept) {
          t.push_back(0);
          continue;
        }
        if (free_.empty()) ADD_FAILURE() << "the plan has too few blocks for the test's requests";
        t.push_back(free_.empty() ? 0 : free_.back());
        if (!free_.empty()) free_.pop_back();
      }
      tables.push_back(std::move(t));
    }
    return blocks_by_group_.emplace(g.kv_cache_group, std::move(tables)).first->second;
  }

  model::ModelDesc desc_;
  plan::CachePlan plan_;
  std::vector<attn::AttentionGroup> groups_;
  layout::Geometry geometry_;
  std::mt19937_64 rng_;
  std::vector<std::int64_t> free_;
  std::map<int, std::vector<std::byte>> tensors_;
  std::map<int, std::vector<std::vector<std::int64_t>>> blocks_by_group_;
  std::vector<LayerCase> cases_;
};

TEST(PlanKernels, Qwen3NextVllmPlanSplits544TokenBlocksInto32TokenPages) {
  PlanRun run("qwen3-next-80b-a3b", std::nullopt, plan::Policy::kVllm, 64 * kMiB, 1024);
  run.prepare({{1000, 1}, {600, 9}});
  ASSERT_EQ(run.cases().front().geometry.block_tokens, 544);
  ASSERT_EQ(run.cases().front().geometry.kernel_tokens, 32);
  run.expect_all_match();
}

TEST(PlanKernels, GptOss20bWithEagle3MixkvPlanSlidingSinksAndDraft) {
  PlanRun run("gpt-oss-20b", "eagle3-gpt-oss-20b", plan::Policy::kMixkv, 64 * kMiB, 2048);
  run.prepare({{1000, 1}, {500, 4}, {90, 1}});
  std::set<std::int64_t> windows;
  std::set<bool> sinks;
  for (const auto& c : run.cases()) {
    windows.insert(c.spec.params.window_left);
    sinks.insert(c.spec.params.sinks);
  }
  EXPECT_EQ(windows, (std::set<std::int64_t>{-1, 127}));
  EXPECT_EQ(sinks, (std::set<bool>{false, true}));
  run.expect_all_match();
}

TEST(PlanKernels, GptOss20bFp8TargetBesideBf16Draft) {
  model::DescribeOptions d;
  d.kv_dtype = DType::kFp8E4m3;
  d.draft_kv_dtype = DType::kBfloat16;
  PlanRun run("gpt-oss-20b", "eagle3-gpt-oss-20b", plan::Policy::kMixkv, 64 * kMiB, 2048, d);
  run.prepare({{700, 1}, {300, 5}});
  std::set<DType> dtypes;
  for (const auto& c : run.cases()) dtypes.insert(c.spec.params.kv_dtype);
  EXPECT_EQ(dtypes, (std::set<DType>{DType::kBfloat16, DType::kFp8E4m3}));
  run.expect_all_match();
}

TEST(PlanKernels, DeepseekV3MlaPlan) {
  PlanRun run("deepseek-v3", std::nullopt, plan::Policy::kMixkv, 64 * kMiB, 512);
  run.prepare({{300, 1}, {100, 6}});
  EXPECT_TRUE(run.cases().front().spec.mla);
  run.expect_all_match();
}

TEST(PlanKernels, Qwen3_8bWithDflashDraftAttendsNonCausallyInItsBlock) {
  PlanRun run("qwen3-8b", "dflash-qwen3-8b-b16", plan::Policy::kMixkv, 64 * kMiB, 256);
  run.prepare({{200, 16}, {40, 1}});
  std::set<bool> causal;
  for (const auto& c : run.cases()) causal.insert(c.spec.params.causal);
  EXPECT_EQ(causal, (std::set<bool>{false, true}));
  run.expect_all_match();
}

// The manager page divided into one kernel page too many: every kernel page but the first of a
// block is read from the wrong bytes.
TEST(PlantedFault, OffByOneKernelPageStrideIsCaught) {
  for (auto policy : {plan::Policy::kVllm, plan::Policy::kMixkv}) {
    const bool vllm = policy == plan::Policy::kVllm;
    PlanRun run(vllm ? "qwen3-next-80b-a3b" : "gpt-oss-20b",
                vllm ? std::nullopt : std::optional<std::string_view>("eagle3-gpt-oss-20b"), policy,
                64 * kMiB, vllm ? 1024 : 2048);
    run.prepare({{1000, 1}, {300, 4}});
    for (const LayerCase& c : run.cases()) {
      ASSERT_TRUE(run.run(c).ok());  // the true geometry matches
      layout::LayerGeometry wrong = c.geometry;
      const std::int64_t page = wrong.kernel_page_stride * wrong.kernel_pages_per_block;
      wrong.kernel_page_stride = page / (wrong.kernel_pages_per_block + 1);
      const testing::Comparison r = run.run(c, &wrong);
      EXPECT_FALSE(r.ok()) << c.desc->name << ": a wrong stride went unnoticed: " << r.to_string();
    }
  }
}

// A sliding-window layer run with the full layer's window_left reads tokens (and freed blocks)
// it must not.
TEST(PlantedFault, SlidingLayerGivenTheFullWindowIsCaught) {
  PlanRun run("gpt-oss-20b", "eagle3-gpt-oss-20b", plan::Policy::kMixkv, 64 * kMiB, 2048);
  run.prepare({{1000, 1}, {300, 4}});
  int sliding = 0;
  for (const LayerCase& c : run.cases()) {
    if (c.spec.params.window_left < 0) continue;
    ++sliding;
    AttentionSpec wrong = c.spec;
    wrong.params.window_left = -1;
    EXPECT_FALSE(run.run(c, nullptr, &wrong).ok()) << c.desc->name;
  }
  EXPECT_GT(sliding, 0);
}

}  // namespace
}  // namespace mixkv::kernels
