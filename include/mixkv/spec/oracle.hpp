// The oracle drafter: the target's own greedy continuation, known from an earlier plain run.
// Every draft is accepted, so it measures the upper bound of speculation.
#pragma once

#include <vector>

#include "mixkv/spec/drafter.hpp"

namespace mixkv::spec {

class OracleDrafter final : public Drafter {
 public:
  // references[i]: request i's prompt followed by its plain greedy output.
  explicit OracleDrafter(std::vector<std::vector<TokenId>> references);
  std::string name() const override { return "oracle"; }
  bool drafts_for_free() const override { return true; }
  std::vector<TokenId> propose(const DraftContext& ctx, int k) override;

 private:
  std::vector<std::vector<TokenId>> references_;
};

}  // namespace mixkv::spec
