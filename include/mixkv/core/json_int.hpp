// Integers from untrusted JSON, exactly. nlohmann's get<std::int64_t>() converts a float, a
// boolean or an unsigned above 2^63 - 1 without a word (and a float beyond the range of the
// integer is undefined behaviour), so the readers of files and of peers' messages take their
// integers through json_int64 and refuse what it refuses.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>

#include <nlohmann/json.hpp>

namespace mixkv {

// `value` when it is a JSON integer that an int64 holds; nullopt for anything else (a float,
// even 2.0; a boolean; an integer from 2^63 on).
inline std::optional<std::int64_t> json_int64(const nlohmann::json& value) {
  if (!value.is_number_integer()) return std::nullopt;
  if (value.is_number_unsigned() &&
      value.get<std::uint64_t>() >
          static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return std::nullopt;
  }
  return value.get<std::int64_t>();
}

}  // namespace mixkv
