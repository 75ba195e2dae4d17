// What a model config says about each layer before the run-time choices (tensor parallelism,
// speculative tokens, cache dtypes) are applied. Family parsers produce these; finalize_layer()
// turns one into the LayerDesc of one TP rank.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "mixkv/core/dtype.hpp"
#include "mixkv/model/model.hpp"

namespace mixkv::model {

struct GdnParams {
  std::int64_t num_k_heads, num_v_heads, k_head_dim, v_head_dim, conv_kernel;
};
struct KdaParams {
  std::int64_t num_heads, head_dim, conv_kernel;
};
struct Mamba2Params {
  std::int64_t num_heads, head_dim, state_size, n_groups, conv_kernel;
};
struct Mamba1Params {
  std::int64_t intermediate, state_size, conv_kernel;
};
using RecurrentParams =
    std::variant<std::monostate, GdnParams, KdaParams, Mamba2Params, Mamba1Params>;

struct LayerTemplate {
  LayerDesc desc;  // unsharded (TP 1); kv_dtype holds the model's own dtype; state empty
  RecurrentParams recurrent;
};

// Everything one config says about its model's layers.
struct FamilyLayers {
  std::vector<LayerTemplate> layers;      // the model's decoder layers that hold a cache
  std::vector<LayerTemplate> mtp_layers;  // MTP layers it declares (used only as a drafter)
  DType model_dtype = DType::kBfloat16;
  std::optional<DType> ssm_dtype;  // the config's own recurrent-state dtype, if it sets one
  std::string model_type;
  std::int64_t num_hidden_layers = 0;  // decoder layers, cache-less ones (MLP blocks) included
  // Raw numbers of the language model (text_config when nested), for ModelFacts and for checking
  // that a drafter fits its target; nullopt when the config does not give them.
  std::optional<std::int64_t> hidden_size;
  std::optional<std::int64_t> vocab_size;
  std::optional<std::int64_t> max_position_embeddings;
};

class ConfigReader;

// Dispatches on model_type (reading text_config when the LM is nested); throws Error for
// unknown types, listing the supported ones.
FamilyLayers describe_family(const ConfigReader& root);

struct FinalizeOptions {
  int tp = 1;
  int num_spec_tokens = 0;
  DType kv_dtype = DType::kBfloat16;    // resolved attention cache dtype for this layer
  DType conv_dtype = DType::kBfloat16;  // recurrent conv state
  DType ssm_dtype = DType::kBfloat16;   // recurrent temporal / SSM state
};

// Shards one layer for a TP rank and sizes its state; throws Error naming the layer and the field
// that does not divide.
LayerDesc finalize_layer(const LayerTemplate& layer, const FinalizeOptions& options);

}  // namespace mixkv::model
