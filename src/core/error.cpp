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

void throw_invalid(const std::string& message) { throw Error(ErrorCode::kInvalidInput, message); }
void throw_unsupported(const std::string& message) {
  throw Error(ErrorCode::kUnsupported, message);
}
void throw_internal(const std::string& message) { throw Error(ErrorCode::kInternal, message); }

}  // namespace mixkv
