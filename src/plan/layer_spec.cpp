#include <algorithm>

#include "layout.hpp"
#include "mixkv/core/checked_math.hpp"
#include "mixkv/core/error.hpp"

namespace mixkv::plan {

std::string_view to_string(Policy policy) { return policy == Policy::kVllm ? "vllm" : "mixkv"; }

std::optional<Policy> parse_policy(std::string_view text) {
  if (text == "vllm") return Policy::kVllm;
  if (text == "mixkv") return Policy::kMixkv;
  return std::nullopt;
}

std::string_view to_string(Behaviour behaviour) {
  switch (behaviour) {
    case Behaviour::kAllTokens:
      return "all_tokens";
    case Behaviour::kSliding:
      return "sliding";
    case Behaviour::kChunked:
      return "chunked";
    case Behaviour::kRecurrent:
      return "recurrent";
  }
  return "unknown";
}

LayerSpec layer_spec(const model::LayerDesc& layer) {
  LayerSpec spec;
  spec.layer = layer.name;
  spec.kind = layer.kind;
  spec.window = layer.window;
  spec.chunk = layer.chunk;
  switch (layer.kind) {
    case model::LayerKind::kSliding:
      spec.behaviour = Behaviour::kSliding;
      break;
    case model::LayerKind::kChunked:
      spec.behaviour = Behaviour::kChunked;
      break;
    case model::LayerKind::kFull:
    case model::LayerKind::kMla:
      spec.behaviour = Behaviour::kAllTokens;
      break;
    default:
      spec.behaviour = Behaviour::kRecurrent;
  }
  if (spec.behaviour == Behaviour::kRecurrent) {
    spec.state_bytes = model::state_bytes(layer);
  } else {
    spec.bytes_per_token = model::kv_bytes_per_token(layer);
  }
  return spec;
}

std::int64_t tokens_kept(const LayerSpec& spec, std::int64_t request_len, int spec_tokens) {
  switch (spec.behaviour) {
    case Behaviour::kAllTokens:
      return request_len;
    case Behaviour::kSliding:
      // The window's past (window - 1 tokens) plus the tokens being verified.
      return std::min(request_len, *spec.window + spec_tokens);
    case Behaviour::kChunked:
      return std::min(request_len, *spec.chunk + spec_tokens);
    case Behaviour::kRecurrent:
      return 0;
  }
  return 0;
}

std::int64_t physical_bytes_per_request(const model::ModelDesc& desc, std::int64_t request_len) {
  std::int64_t total = 0;
  for (const auto& layer : desc.layers) {
    const LayerSpec spec = layer_spec(layer);
    if (spec.behaviour == Behaviour::kRecurrent) {
      total =
          checked_add(total, checked_mul(spec.state_bytes, 1 + desc.num_spec_tokens, "state bytes"),
                      "physical bytes per request");
    } else {
      const std::int64_t tokens =
          ceil_div(tokens_kept(spec, request_len, desc.num_spec_tokens), kTokenGranularity) *
          kTokenGranularity;
      total = checked_add(total, checked_mul(tokens, spec.bytes_per_token, "KV bytes"),
                          "physical bytes per request");
    }
  }
  return total;
}

std::int64_t blocks_for(const LayerSpec& spec, std::int64_t block_size, std::int64_t request_len,
                        int spec_tokens) {
  if (spec.behaviour == Behaviour::kRecurrent) return 1 + spec_tokens;
  const std::int64_t all = ceil_div(request_len, block_size);
  if (spec.behaviour == Behaviour::kAllTokens) return all;
  const std::int64_t span = tokens_kept(spec, request_len, spec_tokens);
  if (span >= request_len) return all;
  // A window that starts mid-block straddles one more block.
  return std::min(all, ceil_div(span, block_size) + 1);
}

std::int64_t blocks_needed(const PlannedGroup& group, std::int64_t request_len, int spec_tokens) {
  return blocks_for(*group.layers.front().spec, group.block_size, request_len, spec_tokens);
}

std::int64_t blocks_per_request(const Layout& layout, std::int64_t request_len, int spec_tokens) {
  std::int64_t total = 0;
  for (const auto& g : layout.groups) total += blocks_needed(g, request_len, spec_tokens);
  return total;
}

}  // namespace mixkv::plan
