// Typed, bounds-checked access to one JSON object of a config, with the path to each field kept
// for error messages: "built-in qwen3-8b: text_config.num_attention_heads must be ...".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace mixkv::model {

// Largest count or size a config may state. Far above any real model, far below where 64-bit
// byte arithmetic on products of a few such numbers could overflow unchecked. It is INT32_MAX,
// not 2^31, because LayerDesc keeps head counts and sizes in int: 2^31 would wrap to -2^31.
inline constexpr std::int64_t kMaxConfigInt = (std::int64_t{1} << 31) - 1;

class ConfigReader {
 public:
  // `object` must outlive the reader. `origin` names the document, `path` the object within it.
  ConfigReader(const nlohmann::json& object, std::string origin, std::string path = "");

  bool has(std::string_view key) const;                   // present and not null
  const nlohmann::json& raw(std::string_view key) const;  // throws when missing

  std::int64_t positive_int(std::string_view key) const;
  std::optional<std::int64_t> optional_positive_int(std::string_view key) const;
  std::int64_t non_negative_int(std::string_view key) const;
  double positive_number(std::string_view key) const;
  std::optional<double> optional_positive_number(std::string_view key) const;
  std::optional<bool> optional_bool(std::string_view key) const;
  std::string string(std::string_view key) const;
  std::optional<std::string> optional_string(std::string_view key) const;
  std::vector<std::string> string_list(std::string_view key) const;
  std::vector<std::int64_t> int_list(std::string_view key) const;  // each non-negative
  ConfigReader child(std::string_view key) const;                  // a nested object
  std::optional<ConfigReader> optional_child(std::string_view key) const;

  // "origin: path.key" for messages about one field.
  std::string where(std::string_view key) const;
  const std::string& origin() const { return origin_; }
  const nlohmann::json& object() const { return *object_; }

  [[noreturn]] void fail(std::string_view key, std::string_view problem) const;

 private:
  const nlohmann::json* object_;
  std::string origin_;
  std::string path_;
};

// Parses a config document as Python's json module writes it: strict JSON plus the bare constants
// Infinity, -Infinity and NaN (HF configs hold them, e.g. Mamba's time_step_limit), which become
// those doubles; the same words inside strings are left alone. Throws what nlohmann::json::parse
// throws for anything else.
nlohmann::json parse_config_json(std::string_view text);

// Reads `value` (at `where`) as an integer in [min, kMaxConfigInt]; throws a clear Error otherwise.
std::int64_t read_bounded_int(const nlohmann::json& value, std::string_view where,
                              std::int64_t min);

}  // namespace mixkv::model
