#include "mixkv/model/architecture.hpp"

#include <fmt/format.h>

#include "mixkv/core/error.hpp"
#include "model/config_reader.hpp"

namespace mixkv::model {
namespace {

// What nemotron_h and gemma2 configs add; refuses, naming the field, what the runner does not
// compute (biases, MoE blocks, other activations).
void read_family_fields(const ConfigReader& c, Architecture& t) {
  const auto require_string = [&](std::string_view key, std::string_view want) {
    if (auto v = c.optional_string(key); v && *v != want) {
      throw_unsupported(
          fmt::format("{} is '{}'; the reference runner computes {} only", c.where(key), *v, want));
    }
  };
  if (t.model_type == "nemotron_h") {
    t.block_pattern = c.string("hybrid_override_pattern");
    t.rms_norm_eps = c.optional_positive_number("layer_norm_epsilon").value_or(t.rms_norm_eps);
    t.conv_bias = c.optional_bool("use_conv_bias").value_or(true);
    if (auto hd = c.optional_positive_int("attention_head_dim")) t.head_dim = *hd;
    for (std::string_view key : {"use_bias", "attention_bias", "mlp_bias"}) {
      if (c.optional_bool(key).value_or(false)) {
        throw_unsupported(fmt::format(
            "{} is true; the reference runner reads no projection biases (conv1d's aside)",
            c.where(key)));
      }
    }
    if (const auto e = t.block_pattern.find_first_not_of("M*-"); e != std::string::npos) {
      throw_unsupported(fmt::format(
          "{}: block {} is '{}'; the reference runner serves M (Mamba2), * (attention) and "
          "- (MLP) blocks, not mixture-of-experts ones",
          c.where("hybrid_override_pattern"), e, t.block_pattern[e]));
    }
    require_string("mamba_hidden_act", "silu");
    require_string("mlp_hidden_act", "relu2");
  } else if (t.model_type.starts_with("gemma3")) {
    throw_unsupported(fmt::format(
        "{} is '{}'; the reference runner computes Gemma 2's layer, not Gemma 3's (q/k norms, "
        "local RoPE base)",
        c.where("model_type"), t.model_type));
  } else if (t.model_type == "gemma2") {
    t.final_logit_softcap = c.optional_positive_number("final_logit_softcapping");
    require_string("hidden_activation", "gelu_pytorch_tanh");
  }
}

}  // namespace

Architecture read_architecture(const ModelSource& source) {
  const ConfigReader root(*source.doc, source.origin);
  const std::optional<ConfigReader> text = root.optional_child("text_config");
  const ConfigReader& c = text ? *text : root;
  Architecture t;
  t.hidden_size = c.positive_int("hidden_size");
  t.intermediate_size = c.positive_int("intermediate_size");
  t.vocab_size = c.positive_int("vocab_size");
  t.num_layers = c.positive_int("num_hidden_layers");
  t.num_q_heads = c.positive_int("num_attention_heads");
  t.num_kv_heads = c.optional_positive_int("num_key_value_heads").value_or(t.num_q_heads);
  t.head_dim = c.optional_positive_int("head_dim").value_or(t.hidden_size / t.num_q_heads);
  t.rms_norm_eps = c.optional_positive_number("rms_norm_eps").value_or(1e-5);
  t.rope_theta = c.optional_positive_number("rope_theta").value_or(10000.0);
  t.tie_word_embeddings = c.optional_bool("tie_word_embeddings").value_or(false);
  if (t.head_dim % 2 != 0) c.fail("head_dim", "must be even for rotary embeddings");
  t.model_type =
      c.optional_string("model_type").value_or(root.optional_string("model_type").value_or(""));
  if (auto dtype = root.optional_string("torch_dtype")) {
    t.torch_dtype = parse_dtype(*dtype);
    if (!t.torch_dtype) root.fail("torch_dtype", "is not a dtype mixkv knows");
  }
  // DFlash (z-lab's config): mask_token_id under dflash_config, or at the top level.
  const std::optional<ConfigReader> dflash = root.optional_child("dflash_config");
  const ConfigReader& fields = dflash && dflash->has("mask_token_id") ? *dflash : root;
  if (fields.has("mask_token_id")) {
    t.mask_token_id = fields.non_negative_int("mask_token_id");
    if (*t.mask_token_id >= t.vocab_size) {
      fields.fail("mask_token_id", fmt::format("is {}, outside the target's vocabulary of {}",
                                               *t.mask_token_id, t.vocab_size));
    }
  }
  read_family_fields(c, t);
  return t;
}

}  // namespace mixkv::model
