#include "mixkv/core/error.hpp"

namespace mixkv {

std::string_view to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidInput:
      return "invalid input";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kInternal:
      return "internal error";
  }
  return "unknown error";
}

std::string printable(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 0xf];
    } else {
      out += c;
    }
  }
  return out;
}

void throw_invalid(const std::string& message) { throw Error(ErrorCode::kInvalidInput, message); }
void throw_unsupported(const std::string& message) {
  throw Error(ErrorCode::kUnsupported, message);
}
void throw_internal(const std::string& message) { throw Error(ErrorCode::kInternal, message); }

}  // namespace mixkv
