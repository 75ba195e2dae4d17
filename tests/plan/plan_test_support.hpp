// Shared by the plan tests: built-in pairs and plan invariants.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "mixkv/core/error.hpp"
#include "mixkv/model/describe.hpp"
#include "mixkv/plan/plan.hpp"
#include "test_support.hpp"

namespace mixkv::plan::testing {

// Built-in pairs live in the shared test support; the plan tests name them from here.
using mixkv::testing::builtin_pairs;
using mixkv::testing::describe_pair;
using mixkv::testing::Pair;

// Invariants every plan keeps, whatever the policy.
inline void expect_plan_invariants(const model::ModelDesc& desc, const CachePlan& plan,
                                   const std::string& label) {
  SCOPED_TRACE(label);
  std::int64_t tensor_bytes = 0;
  for (const auto& t : plan.tensors) tensor_bytes += t.bytes;
  EXPECT_LE(tensor_bytes, plan.memory_bytes);
  EXPECT_EQ(tensor_bytes + plan.pool_remainder_bytes, plan.memory_bytes);

  // Every layer placed exactly once, in one group and one tensor.
  std::multiset<std::string> placed;
  for (const auto& g : plan.groups) placed.insert(g.layers.begin(), g.layers.end());
  std::multiset<std::string> shared;
  for (const auto& t : plan.tensors) shared.insert(t.shared_by.begin(), t.shared_by.end());
  std::multiset<std::string> expected;
  for (const auto& l : desc.layers) expected.insert(l.name);
  EXPECT_EQ(placed, expected);
  EXPECT_EQ(shared, expected);

  // The reported concurrency is achievable: that many requests' worst-case blocks fit beside the
  // null block.
  const auto& c = plan.concurrency;
  std::int64_t per_request = 0;
  for (const auto& g : plan.groups) per_request += g.blocks_per_request;
  EXPECT_EQ(per_request, c.blocks_per_request);
  EXPECT_LE(c.max_requests * c.blocks_per_request, plan.pools[0].num_blocks - 1);
  EXPECT_GT((c.max_requests + 1) * c.blocks_per_request, plan.pools[0].num_blocks - 1);

  // Allocated bytes per request = physical bytes + named waste.
  EXPECT_EQ(c.blocks_per_request * plan.block_unit_bytes,
            c.physical_bytes_per_request + plan.waste_per_request.total());
  EXPECT_EQ(c.physical_bytes_per_request, physical_bytes_per_request(desc, plan.request_len));

  // Layers of one group never overlap inside a block, and stay inside it: kernel page k of a layer
  // lives at offset + k * stride for the block's kernel pages.
  for (const auto& g : plan.groups) {
    const bool recurrent = g.behaviour == Behaviour::kRecurrent;
    const std::int64_t sub_pages = recurrent ? 1 : g.block_size / g.kernel_block_size;
    if (!recurrent) {
      EXPECT_EQ(g.block_size % g.kernel_block_size, 0) << "group " << g.id;
    }
    std::map<int, std::vector<std::pair<std::int64_t, std::int64_t>>>
        ranges;  // tensor -> [begin, end)
    for (const auto& p : g.placement) {
      const std::int64_t piece = p.bytes / sub_pages;
      EXPECT_EQ(piece * sub_pages, p.bytes);
      for (std::int64_t k = 0; k < sub_pages; ++k) {
        ranges[p.tensor].emplace_back(p.offset_bytes + k * p.kernel_page_stride_bytes,
                                      p.offset_bytes + k * p.kernel_page_stride_bytes + piece);
      }
      const std::int64_t tensor_page = plan.tensors.at(p.tensor).bytes / plan.pools[0].num_blocks;
      EXPECT_EQ(p.kernel_page_stride_bytes * sub_pages, tensor_page)
          << p.layer << " kernel pages are not uniformly strided";
    }
    for (auto& [tensor, rs] : ranges) {
      std::sort(rs.begin(), rs.end());
      const std::int64_t tensor_page = plan.tensors.at(tensor).bytes / plan.pools[0].num_blocks;
      for (std::size_t i = 0; i < rs.size(); ++i) {
        EXPECT_GE(rs[i].first, 0);
        EXPECT_LE(rs[i].second, tensor_page) << "group " << g.id << " spills out of its block";
        if (i > 0) {
          EXPECT_LE(rs[i - 1].second, rs[i].first) << "group " << g.id << " layers overlap";
        }
      }
    }
  }
}

}  // namespace mixkv::plan::testing
