// The self-speculative drafter (LayerSkip-style early exit, Elhoushi et al. 2024; Zhang et al.
// 2023): the target's own first L layers, then its final norm and LM head, over the target's own
// cache of those layers. docs/engine.md, "Self-speculative drafting".
#pragma once

#include "mixkv/runner/model_runner.hpp"
#include "mixkv/spec/drafter.hpp"

namespace mixkv::spec {

// Drafts token by token, every request of the step in one shallow forward per chain position:
// position num_computed holds the last verified token, whose draft exit gives d1; d1 at the next
// position gives d2, and so on. Its K/V writes go to the target's cache of the first L layers,
// for exactly the tokens and positions the target's verify then writes again (same bits: the
// layers before L see the same inputs); slots past the accepted drafts are look-ahead, rewritten
// before any read. It keeps no state between steps.
class SelfDrafter final : public Drafter {
 public:
  // Throws Error when `runner` was not built with RunnerOptions::self_draft_layers.
  explicit SelfDrafter(runner::ModelRunner& runner);
  std::string name() const override { return "self"; }
  std::vector<TokenId> propose(const DraftContext& ctx, int k) override;
  std::vector<std::vector<TokenId>> propose_batch(std::span<const DraftContext> ctxs,
                                                  int k) override;

 private:
  runner::ModelRunner& runner_;
};

}  // namespace mixkv::spec
