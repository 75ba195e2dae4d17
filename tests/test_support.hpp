// Helpers shared by the test programs.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mixkv/builtin/builtin_models.hpp"
#include "mixkv/core/error.hpp"
#include "mixkv/model/describe.hpp"
#include "mixkv/model/model.hpp"

namespace mixkv::testing {

inline constexpr std::int64_t kMiB = std::int64_t{1} << 20;
inline constexpr std::int64_t kGiB = std::int64_t{1} << 30;

struct Pair {
  std::string target;
  std::optional<std::string> draft;
  std::string label() const { return target + (draft ? " + " + *draft : ""); }
};

// Every built-in target alone, with each built-in drafter made for it, and with its MTP layers.
inline std::vector<Pair> builtin_pairs() {
  std::vector<Pair> pairs;
  for (const auto& m : builtin::builtin_models()) {
    if (m.role != builtin::Role::kTarget) continue;
    pairs.push_back({std::string(m.name), std::nullopt});
    for (const auto& d : builtin::builtin_models()) {
      for (auto t : d.targets) {
        if (t == m.name) pairs.push_back({std::string(m.name), std::string(d.name)});
      }
    }
    try {
      model::describe_refs(m.name, model::kMtpDraft, {});
      pairs.push_back({std::string(m.name), std::string(model::kMtpDraft)});
    } catch (const Error&) {
    }
  }
  return pairs;
}

inline model::ModelDesc describe_pair(const Pair& p, const model::DescribeOptions& options = {}) {
  std::optional<std::string_view> draft;
  if (p.draft) draft = *p.draft;
  return model::describe_refs(p.target, draft, options);
}

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
// The layers' indices, in order.
inline std::vector<int> indices(const std::vector<const model::LayerDesc*>& layers) {
  std::vector<int> out;
  for (const auto* l : layers) out.push_back(l->index);
  return out;
}

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
