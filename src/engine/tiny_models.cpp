#include "mixkv/engine/tiny_models.hpp"

#include <fmt/format.h>

#include <array>

namespace mixkv::engine {
namespace {

// gpt-oss-like: sliding-window (32 tokens, with learned sinks) and full layers alternating,
// GQA 4/2. Dense SwiGLU MLP instead of gpt-oss's experts (docs/engine.md).
constexpr std::string_view kTinySwa = R"({
  "_source": "mixkv tiny model with generated weights (seed 7); shapes chosen to run in milliseconds",
  "model_type": "gpt_oss",
  "architectures": ["GptOssForCausalLM"],
  "hidden_size": 64,
  "intermediate_size": 128,
  "num_hidden_layers": 4,
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "head_dim": 16,
  "sliding_window": 32,
  "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
  "vocab_size": 260,
  "max_position_embeddings": 2048,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "float32",
  "bos_token_id": 256,
  "eos_token_id": 257
})";

// Qwen3-Next-like: Gated DeltaNet layers with a full-attention layer every fourth, GQA 4/2, and
// one MTP layer (`--draft mtp`; its weights are generated with seed + 1).
constexpr std::string_view kTinyHybrid = R"({
  "_source": "mixkv tiny model with generated weights (seed 11); shapes chosen to run in milliseconds",
  "model_type": "qwen3_next",
  "architectures": ["Qwen3NextForCausalLM"],
  "hidden_size": 64,
  "intermediate_size": 128,
  "num_hidden_layers": 8,
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "head_dim": 16,
  "full_attention_interval": 4,
  "linear_num_key_heads": 2,
  "linear_num_value_heads": 4,
  "linear_key_head_dim": 16,
  "linear_value_head_dim": 16,
  "linear_conv_kernel_dim": 4,
  "num_nextn_predict_layers": 1,
  "vocab_size": 260,
  "max_position_embeddings": 2048,
  "rms_norm_eps": 1e-06,
  "rope_theta": 10000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "float32",
  "bos_token_id": 256,
  "eos_token_id": 257
})";

// Nemotron-H-like: blocks of hybrid_override_pattern, each one mixer or one MLP with its own norm
// and residual: 4 Mamba2 (8 heads of 8, 2 B/C groups, state 16, conv 4), 2 attention (GQA 4/2,
// no RoPE, as Nemotron-H) and 2 relu² MLP blocks.
constexpr std::string_view kTinyMamba = R"({
  "_source": "mixkv tiny model with generated weights (seed 17); shapes chosen to run in milliseconds",
  "model_type": "nemotron_h",
  "architectures": ["NemotronHForCausalLM"],
  "hidden_size": 64,
  "intermediate_size": 128,
  "num_hidden_layers": 8,
  "hybrid_override_pattern": "M-M*M-M*",
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "head_dim": 16,
  "mamba_num_heads": 8,
  "mamba_head_dim": 8,
  "ssm_state_size": 16,
  "n_groups": 2,
  "conv_kernel": 4,
  "use_conv_bias": true,
  "use_bias": false,
  "mamba_hidden_act": "silu",
  "mlp_hidden_act": "relu2",
  "vocab_size": 260,
  "max_position_embeddings": 2048,
  "layer_norm_epsilon": 1e-05,
  "tie_word_embeddings": false,
  "torch_dtype": "float32",
  "bos_token_id": 256,
  "eos_token_id": 257
})";

// Gemma 2-like: sliding window 32 and full layers alternating, attention logits soft-capped at 50,
// scale 1/sqrt(query_pre_attn_scalar 24) rather than 1/sqrt(head_dim 16), final logits capped at
// 30, GQA 4/2. Untied LM head (Gemma 2 ties it): with generated weights a tied head makes the
// model repeat its last token.
constexpr std::string_view kTinyGemma = R"({
  "_source": "mixkv tiny model with generated weights (seed 19); shapes chosen to run in milliseconds",
  "model_type": "gemma2",
  "architectures": ["Gemma2ForCausalLM"],
  "hidden_size": 64,
  "intermediate_size": 128,
  "num_hidden_layers": 4,
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "head_dim": 16,
  "sliding_window": 32,
  "attn_logit_softcapping": 50.0,
  "final_logit_softcapping": 30.0,
  "query_pre_attn_scalar": 24,
  "hidden_activation": "gelu_pytorch_tanh",
  "vocab_size": 260,
  "max_position_embeddings": 2048,
  "rms_norm_eps": 1e-06,
  "rope_theta": 10000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "float32",
  "bos_token_id": 256,
  "eos_token_id": 257
})";

// EAGLE-style drafter for tiny-swa: one llama decoder layer, MHA (4 query and 4 KV heads) beside
// the GQA target, and a bfloat16 cache beside the target's float32 one. Its weights are random
// like the target's, so it proposes almost nothing the target accepts: it exercises the
// drafter's path through the shared cache, not speculation's gain.
constexpr std::string_view kTinyEagle = R"({
  "_source": "mixkv tiny EAGLE drafter with generated weights, seed 13",
  "model_type": "llama",
  "architectures": ["EagleLlamaForCausalLM"],
  "hidden_size": 64,
  "intermediate_size": 96,
  "num_hidden_layers": 1,
  "num_attention_heads": 4,
  "num_key_value_heads": 4,
  "head_dim": 16,
  "vocab_size": 260,
  "max_position_embeddings": 2048,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16"
})";

// DFlash block drafter (z-lab's DFlashDraftModel layout) for tiny-swa and tiny-hybrid: a sliding
// (window 24) and a full Qwen3 layer (q/k norm), as the later Qwen3.5 DFlash drafters mix them,
// attending non-causally within a block of up to 8 tokens; keys and values of the context
// projected from the outputs of target layers 1 and 3; <|pad|> as the mask token (byte prompts
// never contain it); a float16 cache. Random weights, like tiny-eagle's: it exercises the block
// path through the shared cache, not speculation's gain.
constexpr std::string_view kTinyDflash = R"({
  "_source": "mixkv tiny DFlash drafter with generated weights, seed 17",
  "model_type": "qwen3",
  "architectures": ["DFlashDraftModel"],
  "block_size": 8,
  "dflash_config": {"target_layer_ids": [1, 3], "mask_token_id": 258},
  "hidden_size": 64,
  "intermediate_size": 96,
  "num_hidden_layers": 2,
  "layer_types": ["sliding_attention", "full_attention"],
  "sliding_window": 24,
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "head_dim": 16,
  "vocab_size": 260,
  "max_position_embeddings": 2048,
  "rms_norm_eps": 1e-06,
  "rope_theta": 10000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "float16"
})";

constexpr std::array kModels = {
    TinyModel{"tiny-swa",
              "gpt-oss-like: 4 layers alternating sliding window 32 (sinks) / full, GQA 4/2", 7,
              kTinySwa, "", ""},
    TinyModel{"tiny-hybrid",
              "Qwen3-Next-like: 6 Gated DeltaNet + 2 full layers, GQA 4/2, 1 MTP layer", 11,
              kTinyHybrid, "", ""},
    TinyModel{"tiny-mamba",
              "Nemotron-H-like: 4 Mamba2 + 2 attention (no RoPE) + 2 MLP blocks, GQA 4/2", 17,
              kTinyMamba, "", ""},
    TinyModel{"tiny-gemma",
              "Gemma 2-like: 4 layers alternating sliding window 32 / full, soft cap 50, GQA 4/2",
              19, kTinyGemma, "", ""},
    TinyModel{"tiny-eagle",
              "EAGLE-style drafter for tiny-swa: 1 llama layer, MHA 4/4, bfloat16 cache", 13,
              kTinyEagle, "", "tiny-swa"},
    TinyModel{"tiny-dflash",
              "DFlash block drafter for tiny-swa and tiny-hybrid: 2 non-causal qwen3 layers "
              "(sliding 24, full), blocks of 8, reads target layers 1 and 3, float16 cache",
              17, kTinyDflash, "", "tiny-swa tiny-hybrid"},
};

constexpr std::array<std::string_view, 4> kSpecials = {"<|bos|>", "<|eos|>", "<|pad|>", "<|unk|>"};

}  // namespace

std::vector<TokenId> encode_bytes(std::string_view text) {
  std::vector<TokenId> out;
  out.reserve(text.size());
  for (char c : text) out.push_back(static_cast<TokenId>(static_cast<unsigned char>(c)));
  return out;
}

std::string decode_bytes(std::span<const TokenId> tokens) {
  std::string out;
  for (TokenId t : tokens) {
    if (t >= 0 && t < 256) {
      out.push_back(static_cast<char>(static_cast<unsigned char>(t)));
    } else if (t >= kBosToken && t < kByteVocabSize) {
      out += kSpecials[static_cast<std::size_t>(t - kBosToken)];
    } else {
      out += fmt::format("<|{}|>", t);
    }
  }
  return out;
}

std::span<const TinyModel> tiny_models() { return kModels; }

bool drafts_for(const TinyModel& drafter, std::string_view target) {
  std::string_view rest = drafter.draft_for;
  while (!rest.empty()) {
    const std::size_t space = rest.find(' ');
    if (rest.substr(0, space) == target) return true;
    rest = space == std::string_view::npos ? std::string_view{} : rest.substr(space + 1);
  }
  return false;
}

const TinyModel* find_tiny_model(std::string_view name) {
  for (const TinyModel& m : kModels) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

model::ModelSource tiny_model_source(const TinyModel& model) {
  return model::parse_model_source(std::string(model.name), fmt::format("tiny {}", model.name),
                                   model.config_json);
}

}  // namespace mixkv::engine
