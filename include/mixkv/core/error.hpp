// mixkv's one error type. Every failure a user can cause (a bad config, an option that does not
// fit, a plan that cannot be laid out) is an Error whose message names the file, layer, group or
// field at fault and says what would fix it. The code tells callers (and the CLI's exit status) who
// is to blame.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace mixkv {

enum class ErrorCode {
  kInvalidInput,  // malformed or inconsistent input: a config field, a CLI option, a model file,
                  // a dtype name mixkv does not know
  kUnsupported,   // well-formed input that mixkv does not handle (an unknown model_type)
  kInternal,      // a broken invariant inside mixkv: a bug
};

std::string_view to_string(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}

  ErrorCode code() const noexcept { return code_; }
  // Exit status the CLI uses: 2 for bad usage or input, 1 for internal failure.
  int exit_code() const noexcept { return code_ == ErrorCode::kInternal ? 1 : 2; }

 private:
  ErrorCode code_;
};

[[noreturn]] void throw_invalid(const std::string& message);
[[noreturn]] void throw_unsupported(const std::string& message);
[[noreturn]] void throw_internal(const std::string& message);

}  // namespace mixkv
