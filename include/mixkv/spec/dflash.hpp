// The DFlash block drafter on the runner's drafter layers (RunnerOptions::draft of a DFlash
// config, `tiny-dflash`). docs/engine.md, "DFlash block drafter".
#pragma once

#include <vector>

#include "mixkv/runner/model_runner.hpp"
#include "mixkv/spec/drafter.hpp"

namespace mixkv::spec {

// observe() writes the drafter's K/V of the newly verified positions, projected from the
// target's chosen layers, before they are committed, so every cached block holds what a run
// without speculation would have put there. propose() drafts a whole block in one forward: the
// last verified token and k mask tokens, attending non-causally to the context and each other;
// the block's K/V lands in look-ahead slots the next observe() rewrites. Both run over every
// request of the step in one batched forward. It keeps no state between steps.
class DflashDrafter final : public Drafter {
 public:
  explicit DflashDrafter(runner::ModelRunner& runner);
  std::string name() const override { return "dflash"; }
  std::vector<TokenId> propose(const DraftContext& ctx, int k) override;
  std::vector<std::vector<TokenId>> propose_batch(std::span<const DraftContext> ctxs,
                                                  int k) override;
  void observe(const DraftContext& ctx, std::int64_t first,
               std::span<const float> features) override;
  void observe_batch(std::span<const Observation> observations) override;

 private:
  runner::ModelRunner& runner_;
};

}  // namespace mixkv::spec
