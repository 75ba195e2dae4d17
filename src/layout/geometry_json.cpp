#include "mixkv/layout/geometry_json.hpp"

#include "mixkv/core/json_optional.hpp"

namespace mixkv::layout {

using nlohmann::json;

json to_json(const std::vector<attn::AttentionGroup>& groups) {
  json out = json::array();
  for (const auto& g : groups) {
    const auto& p = g.params;
    out.push_back({{"id", g.id},
                   {"kv_cache_group", g.kv_cache_group},
                   {"backend", backend::to_string(g.backend)},
                   {"layers", g.layers},
                   {"kernel_block_size", g.kernel_block_size},
                   {"kv_dtype", to_string(p.kv_dtype)},
                   {"window_left", p.window_left},
                   {"soft_cap", json_or_null(p.soft_cap)},
                   {"scale", p.scale},
                   {"sinks", p.sinks},
                   {"causal", p.causal},
                   {"num_q_heads", p.num_q_heads},
                   {"num_kv_heads", p.num_kv_heads},
                   {"kv_layout", attn::to_string(g.layout)},
                   {"kv_split", g.kv_split},
                   {"kernel_path", g.kernel_path},
                   {"split_reason", g.split_reason}});
  }
  return out;
}

json to_json(const Geometry& geometry) {
  json tensors = json::array();
  for (const auto& t : geometry.tensors) {
    tensors.push_back(
        {{"bytes", t.bytes}, {"num_pages", t.num_pages}, {"page_stride", t.page_stride}});
  }
  json layers = json::array();
  for (const auto& l : geometry.layers) {
    json j = {{"layer", l.layer},
              {"kv_cache_group", l.kv_cache_group},
              {"tensor", l.tensor},
              {"offset", l.offset},
              {"recurrent", l.recurrent}};
    if (l.recurrent) {
      j["state_bytes"] = l.state_bytes;
      j["state_stride"] = l.kernel_page_stride;
    } else {
      j["attention_group"] = l.attention_group;
      j["block_tokens"] = l.block_tokens;
      j["kernel_tokens"] = l.kernel_tokens;
      j["kernel_pages_per_block"] = l.kernel_pages_per_block;
      j["kernel_page_stride"] = l.kernel_page_stride;
      j["kernel_page_bytes"] = l.kernel_page_bytes;
      j["k_token_bytes"] = l.k_token_bytes;
      j["v_token_bytes"] = l.v_token_bytes;
      j["v_offset"] = l.v_offset;
      j["kv_layout"] = attn::to_string(l.kv_layout);
      j["num_kv_heads"] = l.num_kv_heads;
    }
    layers.push_back(std::move(j));
  }
  return {{"tensors", std::move(tensors)}, {"layers", std::move(layers)}};
}

}  // namespace mixkv::layout
