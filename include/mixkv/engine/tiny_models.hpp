// Tiny models with generated weights for the reference engine: a byte-level vocabulary (so text
// round-trips) and HuggingFace-style configs parsed by the normal describe path. They are kept
// apart from the built-in registry (src/builtin), whose models every plan sweep iterates.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mixkv/cache/block_hash.hpp"
#include "mixkv/model/describe.hpp"

namespace mixkv::engine {

using cache::TokenId;

// Byte-level vocabulary: ids 0..255 are bytes, then a few special tokens.
inline constexpr TokenId kBosToken = 256;
inline constexpr TokenId kEosToken = 257;
inline constexpr TokenId kPadToken = 258;
inline constexpr TokenId kUnkToken = 259;
inline constexpr std::int64_t kByteVocabSize = 260;

std::vector<TokenId> encode_bytes(std::string_view text);
// Bytes as they are; special tokens as "<|bos|>", "<|eos|>", "<|pad|>", "<|unk|>"; ids beyond
// the vocabulary as "<|id|>".
std::string decode_bytes(std::span<const TokenId> tokens);

struct TinyModel {
  std::string_view name;
  std::string_view summary;
  std::uint64_t seed = 0;  // of the generated weights
  std::string_view config_json;
  // Empty when the runner serves every layer; else what it still lacks (the model can be
  // described and planned, but not run).
  std::string_view missing;
  // Drafters: the tiny targets they serve, separated by spaces; empty for targets.
  std::string_view draft_for;
};

// Whether `drafter` serves `target` (one of the names in its draft_for).
bool drafts_for(const TinyModel& drafter, std::string_view target);

std::span<const TinyModel> tiny_models();
const TinyModel* find_tiny_model(std::string_view name);
// The model's config as a describe source ("tiny tiny-swa" in messages).
model::ModelSource tiny_model_source(const TinyModel& model);

}  // namespace mixkv::engine
