// Models compiled into the binary: the real HuggingFace config.json of each (models/*.json, each
// with a "_source" note), so `mixkv describe gpt-oss-20b` needs no files at run time.
#pragma once

#include <span>
#include <string_view>

namespace mixkv::builtin {

enum class Role { kTarget, kDraft };

struct BuiltinModel {
  std::string_view name;
  Role role;
  std::string_view summary;  // one line for `mixkv models`
  // Drafters: the built-in targets it is trained for. Targets: empty (see drafters_for()).
  std::span<const std::string_view> targets;
  std::string_view config_json;
};

std::span<const BuiltinModel> builtin_models();
const BuiltinModel* find_builtin(std::string_view name);

// The built-in target + drafter pair `make demo` and the docs use.
inline constexpr std::string_view kDefaultTarget = "qwen3.5-27b";
inline constexpr std::string_view kDefaultDraft = "dflash-qwen3.5-27b";

}  // namespace mixkv::builtin
