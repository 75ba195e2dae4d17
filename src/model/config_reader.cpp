#include "config_reader.hpp"

#include <cmath>

#include <fmt/format.h>

#include "mixkv/core/error.hpp"

namespace mixkv::model {
namespace {

std::string_view type_name(const nlohmann::json& value) {
  if (value.is_null()) return "null";
  if (value.is_boolean()) return "a boolean";
  if (value.is_number_integer()) return "an integer";
  if (value.is_number()) return "a number";
  if (value.is_string()) return "a string";
  if (value.is_array()) return "a list";
  return "an object";
}

}  // namespace

ConfigReader::ConfigReader(const nlohmann::json& object, std::string origin, std::string path)
    : object_(&object), origin_(std::move(origin)), path_(std::move(path)) {
  if (!object.is_object()) {
    throw_invalid(fmt::format("{}: {} must be a JSON object, found {}", origin_,
                              path_.empty() ? "the document" : path_, type_name(object)));
  }
}

std::string ConfigReader::where(std::string_view key) const {
  return path_.empty() ? fmt::format("{}: field '{}'", origin_, key)
                       : fmt::format("{}: field '{}.{}'", origin_, path_, key);
}

void ConfigReader::fail(std::string_view key, std::string_view problem) const {
  throw_invalid(fmt::format("{} {}", where(key), problem));
}

bool ConfigReader::has(std::string_view key) const {
  auto it = object_->find(key);
  return it != object_->end() && !it->is_null();
}

const nlohmann::json& ConfigReader::raw(std::string_view key) const {
  auto it = object_->find(key);
  if (it == object_->end() || it->is_null()) fail(key, "is missing; add it to the config");
  return *it;
}

std::int64_t read_bounded_int(const nlohmann::json& value, std::string_view where,
                              std::int64_t min) {
  std::int64_t out = 0;
  if (value.is_number_integer()) {
    if (value.is_number_unsigned() && value.get<std::uint64_t>() > std::uint64_t(kMaxConfigInt)) {
      throw_invalid(fmt::format("{} is {}, larger than mixkv accepts ({}); fix the value", where,
                                value.dump(), kMaxConfigInt));
    }
    out = value.get<std::int64_t>();
  } else if (value.is_number_float()) {
    // Some exporters write integers as 4096.0; accept those, reject real fractions.
    double d = value.get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > double(kMaxConfigInt)) {
      throw_invalid(fmt::format("{} is {}, expected an integer", where, value.dump()));
    }
    out = static_cast<std::int64_t>(d);
  } else {
    throw_invalid(fmt::format("{} is {}, expected an integer", where, type_name(value)));
  }
  if (out < min) {
    throw_invalid(fmt::format("{} is {}, expected an integer >= {}", where, out, min));
  }
  if (out > kMaxConfigInt) {
    throw_invalid(fmt::format("{} is {}, larger than mixkv accepts ({}); fix the value", where, out,
                              kMaxConfigInt));
  }
  return out;
}

std::int64_t ConfigReader::positive_int(std::string_view key) const {
  return read_bounded_int(raw(key), where(key), 1);
}

std::optional<std::int64_t> ConfigReader::optional_positive_int(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return positive_int(key);
}

std::int64_t ConfigReader::non_negative_int(std::string_view key) const {
  return read_bounded_int(raw(key), where(key), 0);
}

double ConfigReader::positive_number(std::string_view key) const {
  const auto& value = raw(key);
  if (!value.is_number()) {
    fail(key, fmt::format("is {}, expected a positive number", type_name(value)));
  }
  double d = value.get<double>();
  if (!std::isfinite(d) || d <= 0) {
    fail(key, fmt::format("is {}, expected a positive finite number", value.dump()));
  }
  return d;
}

std::optional<double> ConfigReader::optional_positive_number(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return positive_number(key);
}

std::optional<bool> ConfigReader::optional_bool(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  const auto& value = raw(key);
  if (!value.is_boolean())
    fail(key, fmt::format("is {}, expected true or false", type_name(value)));
  return value.get<bool>();
}

std::string ConfigReader::string(std::string_view key) const {
  const auto& value = raw(key);
  if (!value.is_string()) fail(key, fmt::format("is {}, expected a string", type_name(value)));
  return value.get<std::string>();
}

std::optional<std::string> ConfigReader::optional_string(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return string(key);
}

std::vector<std::string> ConfigReader::string_list(std::string_view key) const {
  const auto& value = raw(key);
  if (!value.is_array())
    fail(key, fmt::format("is {}, expected a list of strings", type_name(value)));
  std::vector<std::string> out;
  out.reserve(value.size());
  for (std::size_t i = 0; i < value.size(); ++i) {
    if (!value[i].is_string()) {
      fail(key, fmt::format("has {} at position {}, expected a string", type_name(value[i]), i));
    }
    out.push_back(value[i].get<std::string>());
  }
  return out;
}

std::vector<std::int64_t> ConfigReader::int_list(std::string_view key) const {
  const auto& value = raw(key);
  if (!value.is_array())
    fail(key, fmt::format("is {}, expected a list of integers", type_name(value)));
  std::vector<std::int64_t> out;
  out.reserve(value.size());
  for (std::size_t i = 0; i < value.size(); ++i) {
    out.push_back(read_bounded_int(value[i], fmt::format("{}[{}]", where(key), i), 0));
  }
  return out;
}

ConfigReader ConfigReader::child(std::string_view key) const {
  const auto& value = raw(key);
  return ConfigReader(value, origin_,
                      path_.empty() ? std::string(key) : fmt::format("{}.{}", path_, key));
}

std::optional<ConfigReader> ConfigReader::optional_child(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return child(key);
}

}  // namespace mixkv::model
