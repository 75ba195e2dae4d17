// The JSON form of a CachePlan (`mixkv plan --json`), documented in docs/plan-json.md.
#pragma once

#include <nlohmann/json.hpp>

#include "mixkv/plan/plan.hpp"

namespace mixkv::plan {

inline constexpr int kPlanSchemaVersion = 1;

nlohmann::json to_json(const CachePlan& plan);

}  // namespace mixkv::plan
