#include "mixkv/builtin/builtin_models.hpp"

#include <array>

#include "builtin_configs.hpp"

namespace mixkv::builtin {
namespace {

constexpr std::array<std::string_view, 1> kForLlama8b = {"llama-3.1-8b"};
constexpr std::array<std::string_view, 1> kForGptOss20b = {"gpt-oss-20b"};
constexpr std::array<std::string_view, 1> kForQwen3_8b = {"qwen3-8b"};
constexpr std::array<std::string_view, 1> kForQwen35_27b = {"qwen3.5-27b"};

using namespace configs;

const std::array kModels = {
    BuiltinModel{"llama-3.1-8b",
                 Role::kTarget,
                 "Llama 3.1 8B: 32 full-attention layers, GQA 32/8",
                 {},
                 kLlama_3_1_8b},
    BuiltinModel{"llama-3.1-70b",
                 Role::kTarget,
                 "Llama 3.1 70B: 80 full-attention layers, GQA 64/8",
                 {},
                 kLlama_3_1_70b},
    BuiltinModel{"mistral-7b",
                 Role::kTarget,
                 "Mistral 7B v0.1: 32 sliding-window (4096) layers",
                 {},
                 kMistral_7b},
    BuiltinModel{
        "qwen3-8b", Role::kTarget, "Qwen3 8B: 36 full-attention layers, GQA 32/8", {}, kQwen3_8b},
    BuiltinModel{"qwen3-32b",
                 Role::kTarget,
                 "Qwen3 32B: 64 full-attention layers, GQA 64/8",
                 {},
                 kQwen3_32b},
    BuiltinModel{"gemma-2-9b",
                 Role::kTarget,
                 "Gemma 2 9B: alternating window 4096 / global, soft cap 50",
                 {},
                 kGemma_2_9b},
    BuiltinModel{
        "gemma-3-27b", Role::kTarget, "Gemma 3 27B: 5 local (1024) : 1 global", {}, kGemma_3_27b},
    BuiltinModel{"gpt-oss-20b",
                 Role::kTarget,
                 "gpt-oss 20B: alternating window 128 / full, sinks",
                 {},
                 kGpt_oss_20b},
    BuiltinModel{"gpt-oss-120b",
                 Role::kTarget,
                 "gpt-oss 120B: alternating window 128 / full, sinks",
                 {},
                 kGpt_oss_120b},
    BuiltinModel{"qwen3-next-80b-a3b",
                 Role::kTarget,
                 "Qwen3-Next 80B-A3B: 36 Gated DeltaNet + 12 full",
                 {},
                 kQwen3_next_80b_a3b},
    BuiltinModel{"qwen3.5-27b",
                 Role::kTarget,
                 "Qwen3.5 27B: 48 Gated DeltaNet + 16 full, MTP",
                 {},
                 kQwen3_5_27b},
    BuiltinModel{"nemotron-h-8b",
                 Role::kTarget,
                 "Nemotron-H 8B: 24 Mamba2 + 4 attention",
                 {},
                 kNemotron_h_8b},
    BuiltinModel{"granite-4.0-h-small",
                 Role::kTarget,
                 "Granite 4.0 H Small: 36 Mamba2 + 4 attention",
                 {},
                 kGranite_4_0_h_small},
    BuiltinModel{
        "jamba-v0.1", Role::kTarget, "Jamba v0.1: 28 Mamba + 4 attention", {}, kJamba_v0_1},
    BuiltinModel{"deepseek-v3", Role::kTarget, "DeepSeek-V3: 61 MLA layers, MTP", {}, kDeepseek_v3},
    BuiltinModel{"kimi-linear-48b",
                 Role::kTarget,
                 "Kimi-Linear 48B-A3B: 20 KDA + 7 MLA",
                 {},
                 kKimi_linear_48b},
    BuiltinModel{"glm-4.5-air",
                 Role::kTarget,
                 "GLM-4.5-Air: 46 full-attention layers, GQA 96/8, MTP",
                 {},
                 kGlm_4_5_air},
    BuiltinModel{"eagle3-llama-3.1-8b", Role::kDraft, "EAGLE-3 head for Llama 3.1 8B (1 layer)",
                 kForLlama8b, kEagle3_llama_3_1_8b},
    BuiltinModel{"eagle3-gpt-oss-20b", Role::kDraft, "EAGLE-3 head for gpt-oss 20B (1 layer)",
                 kForGptOss20b, kEagle3_gpt_oss_20b},
    BuiltinModel{"dflash-qwen3-8b-b16", Role::kDraft,
                 "DFlash block drafter for Qwen3 8B (5 layers, block 16)", kForQwen3_8b,
                 kDflash_qwen3_8b_b16},
    BuiltinModel{"dflash-qwen3.5-27b", Role::kDraft,
                 "DFlash block drafter for Qwen3.5 27B (5 layers, block 16)", kForQwen35_27b,
                 kDflash_qwen3_5_27b},
    BuiltinModel{"mha-draft-qwen3.5-27b", Role::kDraft,
                 "MHA draft (40 = 40 heads) beside the GQA Qwen3.5 27B (1 layer)", kForQwen35_27b,
                 kMha_draft_qwen3_5_27b},
};

}  // namespace

std::span<const BuiltinModel> builtin_models() { return kModels; }

const BuiltinModel* find_builtin(std::string_view name) {
  for (const auto& model : kModels) {
    if (model.name == name) return &model;
  }
  return nullptr;
}

}  // namespace mixkv::builtin
