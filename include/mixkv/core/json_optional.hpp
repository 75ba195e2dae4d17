// An optional value as JSON: the value, or null. Shared by the JSON writers of every module.
#pragma once

#include <optional>

#include <nlohmann/json.hpp>

namespace mixkv {

template <typename T>
nlohmann::json json_or_null(const std::optional<T>& value) {
  return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

}  // namespace mixkv
