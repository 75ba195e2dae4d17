#include "mixkv/plan/plan_json.hpp"

#include "mixkv/core/json_optional.hpp"

namespace mixkv::plan {
namespace {

using nlohmann::json;

json waste_json(const Waste& w) {
  return {{"padding_layers", w.padding_layers},
          {"padded_pages", w.padded_pages},
          {"block_tail", w.block_tail},
          {"sliding_extra_block", w.sliding_extra_block},
          {"checkpoints", w.checkpoints}};
}

}  // namespace

json to_json(const CachePlan& plan) {
  json pools = json::array();
  for (const auto& p : plan.pools)
    pools.push_back({{"id", p.id}, {"page_bytes", p.page_bytes}, {"num_blocks", p.num_blocks}});
  json groups = json::array();
  for (const auto& g : plan.groups) {
    json placement = json::array();
    for (const auto& l : g.placement) {
      placement.push_back({{"layer", l.layer},
                           {"tensor", l.tensor},
                           {"offset_bytes", l.offset_bytes},
                           {"bytes", l.bytes},
                           {"kernel_page_stride_bytes", l.kernel_page_stride_bytes}});
    }
    groups.push_back({{"id", g.id},
                      {"pool", g.pool},
                      {"kind", model::to_string(g.kind)},
                      {"behaviour", to_string(g.behaviour)},
                      {"layers", g.layers},
                      {"block_size", g.block_size},
                      {"page_bytes", g.page_bytes},
                      {"real_page_bytes", g.real_page_bytes},
                      {"window", json_or_null(g.window)},
                      {"chunk", json_or_null(g.chunk)},
                      {"kernel_block_size", g.kernel_block_size},
                      {"blocks_per_request", g.blocks_per_request},
                      {"placement", std::move(placement)}});
  }
  json tensors = json::array();
  for (const auto& t : plan.tensors)
    tensors.push_back({{"pool", t.pool}, {"bytes", t.bytes}, {"shared_by", t.shared_by}});
  const Concurrency& c = plan.concurrency;
  // Totals at full occupancy: per-request waste times the requests the pool holds.
  json waste = waste_json(plan.waste_per_request);
  json waste_total = json::object();
  for (auto& [key, value] : waste.items()) {
    waste_total[key] =
        static_cast<std::int64_t>(double(value.get<std::int64_t>()) * c.max_concurrency);
  }
  waste_total["pool_remainder"] = plan.pool_remainder_bytes;
  return {{"schema_version", kPlanSchemaVersion},
          {"policy", to_string(plan.policy)},
          {"backend", backend::to_string(plan.backend)},
          {"memory_bytes", plan.memory_bytes},
          {"request_len", plan.request_len},
          {"max_model_len", plan.max_model_len},
          {"num_spec_tokens", plan.num_spec_tokens},
          {"block_unit_bytes", plan.block_unit_bytes},
          {"pools", std::move(pools)},
          {"kv_cache_groups", std::move(groups)},
          {"tensors", std::move(tensors)},
          {"concurrency",
           {{"request_len", c.request_len},
            {"blocks_per_request", c.blocks_per_request},
            {"max_requests", c.max_requests},
            {"max_concurrency", c.max_concurrency},
            {"physical_bytes_per_request", c.physical_bytes_per_request},
            {"physical_limit", c.physical_limit},
            {"efficiency", c.efficiency},
            {"at_max_model_len", c.at_max_model_len}}},
          {"waste_bytes", std::move(waste_total)},
          {"waste_bytes_per_request", std::move(waste)},
          {"max_model_len_that_fits", plan.max_model_len_that_fits},
          {"warnings", plan.warnings}};
}

}  // namespace mixkv::plan
