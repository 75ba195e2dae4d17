// Human-readable plan reports for `mixkv plan`.
#pragma once

#include <string>

#include "mixkv/model.hpp"
#include "mixkv/plan.hpp"

namespace mixkv::cli {

std::string format_plan(const model::ModelDesc& desc, const plan::CachePlan& plan);
std::string format_plan_comparison(const model::ModelDesc& desc, const plan::CachePlan& vllm,
                                   const plan::CachePlan& mixkv);

}  // namespace mixkv::cli
