// JSON for attention groups and geometry: the `attention_groups` and `geometry` keys of
// `mixkv plan --json` (docs/plan-json.md).
#pragma once

#include <nlohmann/json.hpp>

#include "mixkv/attn/attention_groups.hpp"
#include "mixkv/layout/geometry.hpp"

namespace mixkv::layout {

nlohmann::json to_json(const std::vector<attn::AttentionGroup>& groups);
nlohmann::json to_json(const Geometry& geometry);

}  // namespace mixkv::layout
