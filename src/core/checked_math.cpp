#include "mixkv/core/checked_math.hpp"

#include <fmt/format.h>

#include "mixkv/core/error.hpp"

namespace mixkv {

std::int64_t checked_add(std::int64_t a, std::int64_t b, std::string_view what) {
  std::int64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) {
    throw_invalid(fmt::format(
        "{} overflows a 64-bit integer ({} + {}); check the sizes it is made of", what, a, b));
  }
  return out;
}

std::int64_t checked_mul(std::int64_t a, std::int64_t b, std::string_view what) {
  std::int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) {
    throw_invalid(fmt::format(
        "{} overflows a 64-bit integer ({} x {}); check the sizes it is made of", what, a, b));
  }
  return out;
}

std::int64_t checked_product(std::initializer_list<std::int64_t> factors, std::string_view what) {
  std::int64_t out = 1;
  for (std::int64_t f : factors) out = checked_mul(out, f, what);
  return out;
}

}  // namespace mixkv
