#include "mixkv/spec/random.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "mixkv/core/error.hpp"

namespace mixkv::spec {

RandomDrafter::RandomDrafter(std::int64_t vocab_size, std::uint64_t seed)
    : vocab_size_(vocab_size), rng_(seed) {}

std::vector<TokenId> RandomDrafter::propose(const DraftContext&, int k) {
  std::uniform_int_distribution<TokenId> dist(0, static_cast<TokenId>(vocab_size_ - 1));
  std::vector<TokenId> out(static_cast<std::size_t>(std::max(k, 0)));
  for (TokenId& t : out) t = dist(rng_);
  return out;
}

}  // namespace mixkv::spec
