// What a model runner needs from a config beyond the per-layer cache shapes of the ModelDesc:
// the whole-model dimensions and the family's own switches (norm form, activation, block
// pattern, logit caps, a DFlash drafter's mask token). Read once, here, beside the family
// parsers that build the ModelDesc, so the runner never parses a config itself.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "mixkv/core/dtype.hpp"
#include "mixkv/model/describe.hpp"

namespace mixkv::model {

struct Architecture {
  std::string model_type;  // the language model's (text_config's when nested)
  std::int64_t hidden_size = 0;
  std::int64_t intermediate_size = 0;
  std::int64_t vocab_size = 0;
  std::int64_t num_layers = 0;
  std::int64_t num_q_heads = 0;
  std::int64_t num_kv_heads = 0;
  std::int64_t head_dim = 0;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false;
  std::optional<DType> torch_dtype;  // the config's own dtype, when it names one
  // nemotron_h: hybrid_override_pattern (M Mamba2, * attention, - MLP) and use_conv_bias.
  std::string block_pattern;
  bool conv_bias = true;
  // gemma2: final_logit_softcapping.
  std::optional<double> final_logit_softcap;
  // DFlash drafters: dflash_config.mask_token_id (or top-level), the token filling a block.
  std::optional<std::int64_t> mask_token_id;
  bool operator==(const Architecture&) const = default;
};

// Reads the fields above from a HuggingFace config (top level or `text_config`). Throws Error
// naming the field for a missing or bad value, and (unsupported) for what no runner computes:
// nemotron_h projection biases, mixture-of-experts blocks or other activations, gemma2
// activations other than gelu_pytorch_tanh, Gemma 3.
Architecture read_architecture(const ModelSource& source);

}  // namespace mixkv::model
