// The planner's internal form: a block unit, the groups drawing blocks from it and where each
// layer sits. Both policies build a Layout; finish_plan() turns one into a CachePlan with its
// concurrency and waste accounted the same way for both, so their numbers compare.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mixkv/plan/plan.hpp"

namespace mixkv::plan {

struct PlannedLayer {
  const LayerSpec* spec = nullptr;
  std::int64_t real_page = 0;    // data bytes per block
  std::int64_t padded_page = 0;  // bytes reserved per block (>= real_page)
  int tensor = 0;
  std::int64_t offset = 0;
  std::int64_t kernel_stride = 0;
};

struct PlannedGroup {
  Behaviour behaviour = Behaviour::kAllTokens;
  std::vector<PlannedLayer> layers;
  std::int64_t block_size = 0;  // tokens (attention); ignored for recurrent groups
  std::int64_t kernel_block_size = 0;
};

struct Layout {
  std::vector<std::int64_t> tensor_pages;  // bytes of one block in each tensor
  std::int64_t unit_bytes = 0;             // one block id across every tensor: their sum
  std::vector<PlannedGroup> groups;
  std::vector<std::string> warnings;
};

// Blocks a layer of `spec` needs for one request with `block_size`-token blocks.
std::int64_t blocks_for(const LayerSpec& spec, std::int64_t block_size, std::int64_t request_len,
                        int spec_tokens);
// Blocks one group needs for one request.
std::int64_t blocks_needed(const PlannedGroup& group, std::int64_t request_len, int spec_tokens);
std::int64_t blocks_per_request(const Layout& layout, std::int64_t request_len, int spec_tokens);

// Fills concurrency, waste, tensors and groups; throws when one request of max_model_len does
// not fit (naming the longest that does).
CachePlan finish_plan(const model::ModelDesc& desc, const PlanOptions& options, Layout layout);

Layout vllm_layout(const model::ModelDesc& desc, const PlanOptions& options,
                   const std::vector<LayerSpec>& specs);
Layout mixkv_layout(const model::ModelDesc& desc, const PlanOptions& options,
                    const std::vector<LayerSpec>& specs, std::int64_t vllm_unit_hint);

// 16-token granularity of the physical limit.
inline constexpr std::int64_t kTokenGranularity = 16;

}  // namespace mixkv::plan
