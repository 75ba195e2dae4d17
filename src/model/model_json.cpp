// The describe/model-file JSON contract (docs/model-file.md). Keys listed there are stable;
// new keys may be added, never renamed.
#include "mixkv/model/model_json.hpp"

#include "mixkv/core/json_optional.hpp"

#include <cmath>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "config_reader.hpp"
#include "mixkv/core/error.hpp"

namespace mixkv::model {
namespace {

using nlohmann::json;

json layer_to_json(const LayerDesc& l) {
  json state = json::array();
  for (const auto& t : l.state) {
    state.push_back({{"name", t.name}, {"shape", t.shape}, {"dtype", to_string(t.dtype)}});
  }
  return {{"name", l.name},
          {"owner", to_string(l.owner)},
          {"index", l.index},
          {"kind", to_string(l.kind)},
          {"num_q_heads", l.num_q_heads},
          {"num_kv_heads", l.num_kv_heads},
          {"head_size", l.head_size},
          {"head_size_v", l.head_size_v},
          {"window", json_or_null(l.window)},
          {"chunk", json_or_null(l.chunk)},
          {"soft_cap", json_or_null(l.soft_cap)},
          {"scale", l.scale},
          {"sinks", l.sinks},
          {"causal", l.causal},
          {"indexer", l.indexer},
          {"kv_dtype", to_string(l.kv_dtype)},
          {"state", std::move(state)},
          // Derived, for readers; ignored when the document is read back.
          {"kv_bytes_per_token", kv_bytes_per_token(l)},
          {"state_bytes", state_bytes(l)}};
}

DType read_dtype(const ConfigReader& c, std::string_view key) {
  std::string text = c.string(key);
  auto dtype = parse_dtype(text);
  if (!dtype) {
    c.fail(key, fmt::format("is '{}', not a known dtype; use one of {}", text,
                            fmt::join(dtype_names(), ", ")));
  }
  return *dtype;
}

int read_int(const ConfigReader& c, std::string_view key, std::int64_t min) {
  return static_cast<int>(read_bounded_int(c.raw(key), c.where(key), min));
}

template <typename Enum>
Enum read_enum(const ConfigReader& c, std::string_view key,
               std::optional<Enum> (*parse)(std::string_view), std::string_view allowed) {
  std::string text = c.string(key);
  auto value = parse(text);
  if (!value) c.fail(key, fmt::format("is '{}'; expected one of {}", text, allowed));
  return *value;
}

// Byte counts exceed the bound on config integers (kMaxConfigInt), so they get their own
// reader: any non-negative int64.
std::optional<std::int64_t> optional_byte_count(const ConfigReader& c, std::string_view key) {
  if (!c.has(key)) return std::nullopt;
  const json& value = c.raw(key);
  if (!value.is_number_integer()) {
    c.fail(key, fmt::format("is {}, expected an integer byte count", value.dump()));
  }
  constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  if (value.is_number_unsigned() && value.get<std::uint64_t>() > kMax) {
    c.fail(key, fmt::format("is {}, larger than a 64-bit byte count", value.dump()));
  }
  const std::int64_t out = value.get<std::int64_t>();
  if (out < 0) c.fail(key, fmt::format("is {}, expected a byte count >= 0", out));
  return out;
}

ModelFacts facts_from_json(const ConfigReader& f) {
  ModelFacts facts;
  facts.max_position_embeddings = f.optional_positive_int("max_position_embeddings");
  facts.hidden_size = f.optional_positive_int("hidden_size");
  facts.vocab_size = f.optional_positive_int("vocab_size");
  facts.weight_bytes = optional_byte_count(f, "weight_bytes");
  facts.weight_estimate = f.optional_string("weight_estimate").value_or("");
  return facts;
}

LayerDesc layer_from_json(const ConfigReader& c) {
  LayerDesc l;
  l.name = c.string("name");
  l.owner = read_enum<Owner>(c, "owner", parse_owner, "target, draft");
  l.index = read_int(c, "index", 0);
  l.kind = read_enum<LayerKind>(c, "kind", parse_layer_kind,
                                "full, sliding, chunked, mla, gdn, kda, mamba2, mamba1, lightning");
  l.num_q_heads = read_int(c, "num_q_heads", 0);
  l.num_kv_heads = read_int(c, "num_kv_heads", 0);
  l.head_size = read_int(c, "head_size", 0);
  l.head_size_v = c.has("head_size_v") ? read_int(c, "head_size_v", 0) : l.head_size;
  l.window = c.optional_positive_int("window");
  l.chunk = c.optional_positive_int("chunk");
  l.soft_cap = c.optional_positive_number("soft_cap");
  l.scale = c.has("scale") ? c.positive_number("scale")
                           : (l.head_size > 0 ? 1.0 / std::sqrt(double(l.head_size)) : 1.0);
  l.sinks = c.optional_bool("sinks").value_or(false);
  l.causal = c.optional_bool("causal").value_or(true);
  l.indexer = c.optional_bool("indexer").value_or(false);
  l.kv_dtype = c.has("kv_dtype") ? read_dtype(c, "kv_dtype") : DType::kBfloat16;
  if (c.has("state")) {
    const json& states = c.raw("state");
    if (!states.is_array()) c.fail("state", "must be a list of {name, shape, dtype} objects");
    for (std::size_t i = 0; i < states.size(); ++i) {
      ConfigReader s(states[i], c.origin(), fmt::format("{}.state[{}]", l.name, i));
      StateTensor t;
      t.name = s.string("name");
      for (auto dim : s.int_list("shape")) t.shape.push_back(dim);
      t.dtype = read_dtype(s, "dtype");
      l.state.push_back(std::move(t));
    }
  }
  return l;
}

}  // namespace

json to_json(const ModelDesc& desc) {
  json layers = json::array();
  for (const auto& l : desc.layers) layers.push_back(layer_to_json(l));
  json out = {{"format", kModelFileFormat},
              {"model", desc.model},
              {"draft", json_or_null(desc.draft)},
              {"tp", desc.tp},
              {"num_spec_tokens", desc.num_spec_tokens}};
  if (desc.draft_info) {
    out["draft_info"] = {{"kind", to_string(desc.draft_info->kind)},
                         {"block_size", json_or_null(desc.draft_info->block_size)},
                         {"target_layer_ids", desc.draft_info->target_layer_ids}};
    if (desc.draft_info->kind == DraftKind::kSelf) {
      out["draft_info"]["shared_target_layers"] = desc.draft_info->shared_target_layers;
    }
  } else {
    out["draft_info"] = nullptr;
  }
  out["facts"] = {{"max_position_embeddings", json_or_null(desc.facts.max_position_embeddings)},
                  {"hidden_size", json_or_null(desc.facts.hidden_size)},
                  {"vocab_size", json_or_null(desc.facts.vocab_size)},
                  {"weight_bytes", json_or_null(desc.facts.weight_bytes)},
                  {"weight_estimate", desc.facts.weight_estimate}};
  out["layers"] = std::move(layers);
  return out;
}

bool is_native_model_file(const json& doc) {
  return doc.is_object() &&
         (doc.contains("format") || (doc.contains("layers") && !doc.contains("model_type")));
}

ModelDesc model_desc_from_json(const json& doc, std::string_view origin) {
  ConfigReader c(doc, std::string(origin));
  if (c.has("format") && c.string("format") != kModelFileFormat) {
    c.fail("format",
           fmt::format("is '{}'; this mixkv reads '{}'", c.string("format"), kModelFileFormat));
  }
  ModelDesc desc;
  desc.model = c.optional_string("model").value_or(std::string(origin));
  desc.draft = c.optional_string("draft");
  desc.tp = c.has("tp") ? read_int(c, "tp", 1) : 1;
  desc.num_spec_tokens = c.has("num_spec_tokens") ? read_int(c, "num_spec_tokens", 0) : 0;
  if (auto info = c.optional_child("draft_info")) {
    DraftInfo d;
    d.kind = read_enum<DraftKind>(*info, "kind", parse_draft_kind,
                                  "eagle, eagle3, mtp, dflash, model, self");
    if (info->has("block_size")) d.block_size = read_int(*info, "block_size", 2);
    if (info->has("target_layer_ids")) {
      for (auto id : info->int_list("target_layer_ids"))
        d.target_layer_ids.push_back(static_cast<int>(id));
    }
    if (info->has("shared_target_layers")) {
      d.shared_target_layers = read_int(*info, "shared_target_layers", 1);
    }
    desc.draft_info = std::move(d);
  }
  if (auto facts = c.optional_child("facts")) desc.facts = facts_from_json(*facts);
  const json& layers = c.raw("layers");
  if (!layers.is_array()) c.fail("layers", "must be a list of layer objects");
  for (std::size_t i = 0; i < layers.size(); ++i) {
    desc.layers.push_back(layer_from_json(
        ConfigReader(layers[i], std::string(origin), fmt::format("layers[{}]", i))));
  }
  try {
    validate(desc);
  } catch (const Error& e) {
    // validate() names the layer and field; the user also needs to know which file holds it.
    throw Error(e.code(), fmt::format("{}: {}", origin, e.what()));
  }
  return desc;
}

}  // namespace mixkv::model
