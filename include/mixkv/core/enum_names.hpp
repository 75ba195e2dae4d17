// Name tables for enums: one array of {name, value} per enum, the first entry of a value being its
// canonical name and later ones accepted aliases. Shared by every module that spells an enum.
#pragma once

#include <iterator>
#include <optional>
#include <string_view>

namespace mixkv {

template <typename Enum>
struct Named {
  std::string_view name;
  Enum value;
};

// `table` is any range of Named<Enum> (a std::array, usually).
template <typename Table, typename Enum>
std::string_view name_of(const Table& table, Enum value) {
  for (const auto& entry : table) {
    if (entry.value == value) return entry.name;
  }
  return "unknown";
}

template <typename Table>
auto value_of(const Table& table, std::string_view name)
    -> std::optional<decltype(std::begin(table)->value)> {
  for (const auto& entry : table) {
    if (entry.name == name) return entry.value;
  }
  return std::nullopt;
}

}  // namespace mixkv
