// Page geometry: kernel pages, slot mapping and transfer descriptors agree with the plan.
#include "mixkv/layout/geometry.hpp"

#include <gtest/gtest.h>

#include <random>
#include <set>

#include "plan/plan_test_support.hpp"
#include "test_support.hpp"

namespace mixkv::layout {
namespace {

using mixkv::testing::kGiB;

struct Built {
  model::ModelDesc desc;
  plan::CachePlan plan;
  std::vector<attn::AttentionGroup> groups;
  Geometry geometry;
};

Built build(model::ModelDesc desc, plan::Policy policy,
            backend::Backend backend = backend::Backend::kFlashinfer,
            std::int64_t memory = 40 * kGiB) {
  plan::PlanOptions o;
  o.policy = policy;
  o.backend = backend;
  o.memory_bytes = memory;
  if (!desc.facts.max_position_embeddings) o.max_model_len = 8192;
  Built b{std::move(desc), {}, {}, {}};
  b.plan = plan::make_plan(b.desc, o);
  b.groups = attn::build_attention_groups(b.desc, b.plan);
  b.geometry = make_geometry(b.desc, b.plan, b.groups);
  return b;
}

TEST(Geometry, PaddedQwen3NextPageSplitsIntoUniformKernelPages) {
  model::DescribeOptions d;
  d.num_spec_tokens = 2;
  const Built b =
      build(testing::describe_builtin("qwen3-next-80b-a3b", {}, d), plan::Policy::kVllm);
  const LayerGeometry& full = b.geometry.layer("layers.3");
  EXPECT_EQ(b.geometry.tensors[full.tensor].page_stride, 1'146'880);
  EXPECT_EQ(full.kernel_tokens, 16);
  EXPECT_EQ(full.kernel_pages_per_block, 35);
  EXPECT_EQ(full.kernel_page_stride, 1'146'880 / 35);
  const LayerGeometry& gdn = b.geometry.layer("layers.0");
  EXPECT_TRUE(gdn.recurrent);
  EXPECT_EQ(gdn.state_bytes, 1'130'496);
  EXPECT_EQ(gdn.kernel_page_stride, 1'146'880);  // the padded page
}

TEST(Geometry, KernelBlockTableExpandsManagerBlocks) {
  LayerGeometry l;
  l.kernel_pages_per_block = 2;
  const std::vector<std::int64_t> blocks = {0, 1, 2};
  EXPECT_EQ(kernel_block_table(l, blocks), (std::vector<std::int64_t>{0, 1, 2, 3, 4, 5}));
}

TEST(Geometry, SlotMappingMatchesManagerBlockArithmetic) {
  const Built b = build(testing::describe_builtin("qwen3-next-80b-a3b"), plan::Policy::kVllm);
  const LayerGeometry& full = b.geometry.layer("layers.3");
  const std::vector<std::int64_t> blocks = {7, 3};
  for (std::int64_t pos : {0, 31, 32, 543, 544, 1000}) {
    const TokenLocation loc = locate_token(full, blocks, pos);
    EXPECT_EQ(loc.slot, blocks[static_cast<std::size_t>(pos / 544)] * 544 + pos % 544) << pos;
  }
  testing::expect_error([&] { locate_token(full, blocks, 2 * 544); }, ErrorCode::kInvalidInput,
                        {"outside"});
}

// For every layer and token of random requests: distinct byte ranges inside the layer's tensor
// and manager page; layers sharing a tensor never overlap; transfer descriptors cover exactly
// the bytes the tokens occupy.
void check_request_geometry(const Built& b, std::mt19937_64& rng, const std::string& label) {
  SCOPED_TRACE(label);
  const std::int64_t num_blocks = b.plan.pools[0].num_blocks;
  for (const auto& kv_group : b.plan.groups) {
    const bool recurrent = kv_group.behaviour == plan::Behaviour::kRecurrent;
    const std::int64_t max_blocks = std::min<std::int64_t>(4, num_blocks - 1);
    const std::int64_t n_blocks = std::uniform_int_distribution<std::int64_t>(1, max_blocks)(rng);
    std::set<std::int64_t> chosen;
    while (static_cast<std::int64_t>(chosen.size()) < n_blocks) {
      chosen.insert(std::uniform_int_distribution<std::int64_t>(1, num_blocks - 1)(rng));
    }
    std::vector<std::int64_t> blocks(chosen.begin(), chosen.end());
    std::shuffle(blocks.begin(), blocks.end(), rng);
    const std::int64_t tokens = recurrent ? 0
                                          : std::uniform_int_distribution<std::int64_t>(
                                                1, n_blocks * kv_group.block_size)(rng);
    std::map<int, std::vector<std::pair<std::int64_t, std::int64_t>>>
        used;  // tensor -> byte ranges
    for (const auto& name : kv_group.layers) {
      const LayerGeometry& l = b.geometry.layer(name);
      const std::int64_t page = b.geometry.tensors[l.tensor].page_stride;
      std::vector<std::pair<std::int64_t, std::int64_t>> mine;
      if (recurrent) {
        for (auto blk : blocks)
          mine.emplace_back(l.offset + blk * page, l.offset + blk * page + l.state_bytes);
      } else {
        for (std::int64_t pos = 0; pos < tokens; ++pos) {
          const TokenLocation loc = locate_token(l, blocks, pos);
          const std::int64_t blk = blocks[static_cast<std::size_t>(pos / l.block_tokens)];
          // A token's piece of each KV head (HND holds them apart; NHD side by side).
          std::vector<std::pair<std::int64_t, std::int64_t>> pieces;
          for (int h = 0; h < l.num_kv_heads; ++h) {
            pieces.emplace_back(loc.k_offset + h * l.k_head_stride(), l.k_head_bytes());
            pieces.emplace_back(loc.v_offset + h * l.v_head_stride(), l.v_head_bytes());
          }
          for (auto [begin, len] : pieces) {
            if (len == 0) continue;
            EXPECT_GE(begin, blk * page);
            EXPECT_LE(begin + len, (blk + 1) * page);  // inside its manager page
            EXPECT_LE(begin + len, b.geometry.tensors[l.tensor].bytes);
            mine.emplace_back(begin, begin + len);
          }
        }
      }
      // Transfer descriptors: the same bytes, no more, no less.
      std::vector<std::pair<std::int64_t, std::int64_t>> sent;
      for (const auto& d : transfer_descriptors(l, blocks, tokens)) {
        EXPECT_EQ(d.tensor, l.tensor);
        for (std::int64_t i = 0; i < d.count; ++i)
          sent.emplace_back(d.base + i * d.stride, d.base + i * d.stride + d.length);
      }
      auto merge = [](std::vector<std::pair<std::int64_t, std::int64_t>> v) {
        std::sort(v.begin(), v.end());
        std::vector<std::pair<std::int64_t, std::int64_t>> out;
        for (auto r : v) {
          if (!out.empty() && r.first <= out.back().second) {
            out.back().second = std::max(out.back().second, r.second);
          } else {
            out.push_back(r);
          }
        }
        return out;
      };
      EXPECT_EQ(merge(sent), merge(mine)) << name;
      for (auto r : mine) used[l.tensor].push_back(r);
    }
    for (auto& [tensor, ranges] : used) {
      std::sort(ranges.begin(), ranges.end());
      for (std::size_t i = 1; i < ranges.size(); ++i) {
        EXPECT_LE(ranges[i - 1].second, ranges[i].first) << "overlap in tensor " << tensor;
      }
    }
  }
}

TEST(GeometryProperties, EveryTokenHasItsOwnBytesAndTransfersMatchKernels) {
  std::mt19937_64 rng(7);
  int hnd_layers = 0;
  for (const auto& pair : plan::testing::builtin_pairs()) {
    for (auto policy : {plan::Policy::kVllm, plan::Policy::kMixkv}) {
      for (auto backend : {backend::Backend::kFlashinfer, backend::Backend::kCpu,
                           backend::Backend::kFlashinferTrtllm}) {
        const std::string label = pair.label() + " " + std::string(plan::to_string(policy)) + " " +
                                  std::string(backend::to_string(backend));
        Built b;
        try {
          b = build(plan::testing::describe_pair(pair), policy, backend, 80 * kGiB);
        } catch (const Error& e) {
          // trtllm-gen serves fewer models (no float32 or e5m2 caches, ...); the others all.
          EXPECT_EQ(backend, backend::Backend::kFlashinferTrtllm) << label << ": " << e.what();
          continue;
        }
        for (const auto& l : b.geometry.layers) hnd_layers += l.hnd();
        check_request_geometry(b, rng, label);
      }
    }
  }
  EXPECT_GT(hnd_layers, 0);  // trtllm-gen's HND pages were among them
}

// HND (trtllm-gen): a page's K half is head by head, each head's tokens side by side; the last
// page's filled part is one descriptor of a piece per head.
TEST(Geometry, HndPagesHoldEachHeadsTokensTogether) {
  const Built b = build(testing::describe_builtin("llama-3.1-8b"), plan::Policy::kMixkv,
                        backend::Backend::kFlashinferTrtllm);
  const LayerGeometry& l = b.geometry.layers.at(0);
  ASSERT_EQ(l.kv_layout, attn::KvLayout::kHND);
  ASSERT_EQ(l.num_kv_heads, 8);
  const std::int64_t head = 128 * 2;  // one head's bf16 K row
  EXPECT_EQ(l.k_head_bytes(), head);
  EXPECT_EQ(l.k_row_stride(), head);
  EXPECT_EQ(l.k_head_stride(), l.kernel_tokens * head);
  const std::vector<std::int64_t> blocks = {5};
  const TokenLocation loc = locate_token(l, blocks, 3);
  const std::int64_t page = l.offset + loc.kernel_page * l.kernel_page_stride;
  EXPECT_EQ(loc.k_offset, page + 3 * head);
  EXPECT_EQ(loc.v_offset, page + l.v_offset + 3 * head);
  const auto d = transfer_descriptors(l, blocks, 3);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0], (TransferDescriptor{l.tensor, page, 3 * head, 8, l.kernel_tokens * head}));
  EXPECT_EQ(d[1],
            (TransferDescriptor{l.tensor, page + l.v_offset, 3 * head, 8, l.kernel_tokens * head}));
}

}  // namespace
}  // namespace mixkv::layout

namespace mixkv::layout {
namespace {

TEST(GeometryErrors, PaddingThatDoesNotDivideIntoKernelPagesIsAClearError) {
  const auto desc = testing::describe_builtin("qwen3-next-80b-a3b");
  plan::PlanOptions o;
  o.policy = plan::Policy::kVllm;
  o.memory_bytes = std::int64_t{40} << 30;
  plan::CachePlan plan = plan::make_plan(desc, o);
  const auto groups = attn::build_attention_groups(desc, plan);
  // Pad every page by 8 bytes: 544 tokens in 17 kernel pages of 32 no longer share one stride.
  for (auto& t : plan.tensors) t.bytes += 8 * plan.pools[0].num_blocks;
  testing::expect_error(
      [&] { make_geometry(desc, plan, groups); }, ErrorCode::kInvalidInput,
      {"layers.3", "does not split evenly into 17 kernel pages", "uneven padding"});
}

}  // namespace
}  // namespace mixkv::layout
