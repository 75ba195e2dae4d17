// The SmolLM2 GGUF that `make deps` fetches, for tests that read the real file. CI runs `make deps`
// first, so there they always run; elsewhere they skip with a message when the file is absent.
#pragma once

#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "mixkv/weights/model_files.hpp"

namespace mixkv::testing {

inline std::optional<std::string> smollm2_path() {
  return weights::find_fetched_file(*weights::find_fetched_model("smollm2-135m"));
}

}  // namespace mixkv::testing

// Declares `const std::string var` holding the file's path, or skips the test.
#define MIXKV_SMOLLM2_OR_SKIP(var)                                                                \
  const std::optional<std::string> var##_found = ::mixkv::testing::smollm2_path();                \
  if (!var##_found) {                                                                             \
    GTEST_SKIP() << "SmolLM2-135M-Instruct.Q4_1.gguf is not in " << ::mixkv::weights::model_dir() \
                 << "; run `make deps` to fetch it";                                              \
  }                                                                                               \
  const std::string var = *var##_found
