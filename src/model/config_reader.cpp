#include "config_reader.hpp"

#include <cmath>
#include <limits>

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

// A JSON string cannot hold a raw NUL, so a config's own text never decodes to these unless it
// spells the escape out on purpose.
constexpr std::string_view kConstantMark = "\\u0000mixkv-python-constant:";

bool word_char(char ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
         ch == '_' || ch == '.';
}

// Turns placeholder strings back into the numbers they stand for.
void restore_constants(nlohmann::json& value, const std::string& mark) {
  if (value.is_string()) {
    const auto& text = value.get_ref<const std::string&>();
    if (!text.starts_with(mark)) return;
    const std::string_view name = std::string_view(text).substr(mark.size());
    const double inf = std::numeric_limits<double>::infinity();
    value = name == "NaN"         ? std::numeric_limits<double>::quiet_NaN()
            : name == "-Infinity" ? -inf
                                  : inf;
  } else if (value.is_structured()) {
    for (auto& child : value) restore_constants(child, mark);
  }
}

// How a value reads in a message: Infinity and NaN as Python writes them (dump() prints null).
std::string shown(const nlohmann::json& value) {
  if (value.is_number_float()) {
    const double d = value.get<double>();
    if (std::isnan(d)) return "NaN";
    if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  }
  return value.dump();
}

}  // namespace

nlohmann::json parse_config_json(std::string_view text) {
  static constexpr std::string_view kConstants[] = {"-Infinity", "Infinity", "NaN"};
  std::string strict;
  strict.reserve(text.size());
  bool in_string = false, escape = false, replaced = false;
  for (std::size_t i = 0; i < text.size();) {
    const char ch = text[i];
    if (in_string) {
      strict += ch;
      if (escape) {
        escape = false;
      } else if (ch == '\\') {
        escape = true;
      } else if (ch == '"') {
        in_string = false;
      }
      ++i;
      continue;
    }
    if (ch == '"') {
      in_string = true;
      strict += ch;
      ++i;
      continue;
    }
    bool matched = false;
    for (std::string_view constant : kConstants) {
      const std::size_t end = i + constant.size();
      if (text.substr(i).starts_with(constant) && (i == 0 || !word_char(text[i - 1])) &&
          (end == text.size() || !word_char(text[end]))) {
        strict += '"';
        strict += kConstantMark;
        strict += constant;
        strict += '"';
        i = end;
        matched = replaced = true;
        break;
      }
    }
    if (!matched) {
      strict += ch;
      ++i;
    }
  }
  nlohmann::json doc = nlohmann::json::parse(strict);
  if (replaced) {
    const std::string mark = std::string(1, '\0') + std::string(kConstantMark.substr(6));
    restore_constants(doc, mark);
  }
  return doc;
}

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
      throw_invalid(fmt::format("{} is {}, expected an integer", where, shown(value)));
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
    fail(key, fmt::format("is {}, expected a positive finite number", shown(value)));
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
