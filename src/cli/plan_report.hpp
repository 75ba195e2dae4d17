// Human-readable plan reports for `mixkv plan`.
#pragma once

#include <string>

#include "mixkv/attn/attention_groups.hpp"
#include "mixkv/model/model.hpp"
#include "mixkv/plan/plan.hpp"

namespace mixkv::cli {

std::string format_plan(const model::ModelDesc& desc, const plan::CachePlan& plan);
std::string format_plan_comparison(const model::ModelDesc& desc, const plan::CachePlan& vllm,
                                   const plan::CachePlan& mixkv);

// One line per attention group: its parameters, kernel page and why it was split off.
std::string format_attention_groups(const std::vector<attn::AttentionGroup>& groups);

}  // namespace mixkv::cli
