// The EAGLE-style chain drafter on the runner's drafter layers (RunnerOptions::draft), and on
// the target's own MTP layers (RunnerOptions::mtp, named "mtp"). docs/engine.md.
#pragma once

#include <map>
#include <vector>

#include "mixkv/runner/model_runner.hpp"
#include "mixkv/spec/drafter.hpp"

namespace mixkv::spec {

// Position q of its cache holds the layer input fc([embedding(t_q); h_(q-1)]), h the target's
// hidden state at the position before. observe() runs it over the newly verified positions with
// the real hidden states before they are committed (so every cached block holds what a plain run
// would have put there) and through the last sampled token, whose output is the first draft;
// propose() chains the remaining k - 1 drafts on the drafter's own hidden states. Both run every
// request of the step in one drafter forward (per chain position, for propose).
class EagleDrafter final : public Drafter {
 public:
  explicit EagleDrafter(runner::ModelRunner& runner);
  std::string name() const override { return name_; }
  std::vector<TokenId> propose(const DraftContext& ctx, int k) override;
  std::vector<std::vector<TokenId>> propose_batch(std::span<const DraftContext> ctxs,
                                                  int k) override;
  void observe(const DraftContext& ctx, std::int64_t first, std::span<const float> hidden) override;
  void observe_batch(std::span<const Observation> observations) override;
  void forget(std::size_t request) override;

 private:
  struct State {
    std::int64_t next = 0;         // first position the drafter has not computed for real
    std::int64_t hidden_base = 0;  // position of hidden's first row
    std::vector<float> hidden;     // target hidden states not consumed yet
    std::int64_t pending_at = -1;  // position whose drafter output gave `pending`
    TokenId pending = 0;
    std::vector<float> pending_hidden;
  };
  runner::ModelRunner& runner_;
  std::string name_;
  std::map<std::size_t, State> states_;
};

}  // namespace mixkv::spec
