// Helpers shared by the test programs.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "mixkv/describe.hpp"
#include "mixkv/error.hpp"
#include "mixkv/model.hpp"

namespace mixkv::testing {

inline model::ModelDesc describe_builtin(std::string_view target,
                                         std::optional<std::string_view> draft = {},
                                         const model::DescribeOptions& options = {}) {
  return model::describe_refs(target, draft, options);
}

// Describes a HuggingFace config given as JSON text (origin "test.json").
inline model::ModelDesc describe_text(std::string_view json_text,
                                      const model::DescribeOptions& options = {}) {
  return model::describe(model::parse_model_source("test", "test.json", json_text), std::nullopt,
                         options);
}

inline std::vector<const model::LayerDesc*> layers_of(const model::ModelDesc& desc,
                                                      model::LayerKind kind,
                                                      model::Owner owner = model::Owner::kTarget) {
  std::vector<const model::LayerDesc*> out;
  for (const auto& l : desc.layers) {
    if (l.kind == kind && l.owner == owner) out.push_back(&l);
  }
  return out;
}

// Runs `fn`, expects a mixkv::Error with `code` whose message contains every one of `needles`.
inline void expect_error(const std::function<void()>& fn, ErrorCode code,
                         std::initializer_list<std::string_view> needles) {
  try {
    fn();
    ADD_FAILURE() << "expected a mixkv::Error, none was thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (auto needle : needles) {
      EXPECT_NE(std::string_view(e.what()).find(needle), std::string_view::npos)
          << "message lacks '" << needle << "': " << e.what();
    }
  }
}

}  // namespace mixkv::testing
