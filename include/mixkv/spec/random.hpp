// The random drafter: seeded uniform tokens, almost all rejected (fault injection for the
// rollback paths).
#pragma once

#include <cstdint>
#include <random>

#include "mixkv/spec/drafter.hpp"

namespace mixkv::spec {

class RandomDrafter final : public Drafter {
 public:
  RandomDrafter(std::int64_t vocab_size, std::uint64_t seed);
  std::string name() const override { return "random"; }
  bool drafts_for_free() const override { return true; }
  std::vector<TokenId> propose(const DraftContext& ctx, int k) override;

 private:
  std::int64_t vocab_size_;
  std::mt19937_64 rng_;
};

}  // namespace mixkv::spec
