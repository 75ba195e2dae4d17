// Overflow-checked 64-bit arithmetic for byte counts and shapes. A config with absurd numbers must
// produce an error that names what overflowed, never a wrapped value.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>

namespace mixkv {

// Each throws Error(kInvalidInput) naming `what` when the result does not fit in int64_t.
std::int64_t checked_add(std::int64_t a, std::int64_t b, std::string_view what);
std::int64_t checked_mul(std::int64_t a, std::int64_t b, std::string_view what);
std::int64_t checked_product(std::initializer_list<std::int64_t> factors, std::string_view what);

// Ceiling division for non-negative a and positive b.
constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return a / b + (a % b != 0); }

}  // namespace mixkv
