#include "mixkv/spec/drafter.hpp"

namespace mixkv::spec {

std::vector<std::vector<TokenId>> Drafter::propose_batch(std::span<const DraftContext> ctxs,
                                                         int k) {
  std::vector<std::vector<TokenId>> out;
  for (const DraftContext& ctx : ctxs) out.push_back(propose(ctx, k));
  return out;
}

void Drafter::observe_batch(std::span<const Observation> observations) {
  for (const Observation& o : observations) observe(o.ctx, o.first, o.features);
}

}  // namespace mixkv::spec
