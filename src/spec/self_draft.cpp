#include "mixkv/spec/self_draft.hpp"

#include <algorithm>

#include "mixkv/core/error.hpp"

namespace mixkv::spec {

SelfDrafter::SelfDrafter(runner::ModelRunner& runner) : runner_(runner) {
  if (runner.self_draft_layers() == 0) {
    throw_invalid(
        "the self drafter needs a runner built with RunnerOptions::self_draft_layers "
        "(--draft self)");
  }
}

std::vector<TokenId> SelfDrafter::propose(const DraftContext& ctx, int k) {
  return propose_batch(std::span(&ctx, 1), k).front();
}

std::vector<std::vector<TokenId>> SelfDrafter::propose_batch(std::span<const DraftContext> ctxs,
                                                             int k) {
  std::vector<std::vector<TokenId>> drafts(ctxs.size());
  // Each request drafts what the scheduler will verify of it (its adaptive length), no more.
  std::vector<int> wanted(ctxs.size());
  int longest = 0;
  for (std::size_t r = 0; r < ctxs.size(); ++r) {
    wanted[r] = std::clamp(ctxs[r].max_drafts, 0, std::max(k, 0));
    if (ctxs[r].tokens.empty()) wanted[r] = 0;
    longest = std::max(longest, wanted[r]);
  }
  const auto vocab = static_cast<std::size_t>(runner_.vocab_size());
  std::vector<runner::SequenceInput> batch;
  std::vector<std::size_t> active;
  for (int i = 0; i < longest; ++i) {
    batch.clear();
    active.clear();
    for (std::size_t r = 0; r < ctxs.size(); ++r) {
      if (wanted[r] <= i) continue;
      const DraftContext& ctx = ctxs[r];
      runner::SequenceInput in;
      in.tokens = i == 0 ? ctx.tokens.last(1) : std::span<const TokenId>(&drafts[r].back(), 1);
      in.start = ctx.num_computed + i;
      in.block_tables.assign(ctx.block_tables.begin(), ctx.block_tables.end());
      in.logits = runner::LogitRows::kLast;
      batch.push_back(std::move(in));
      active.push_back(r);
    }
    const runner::ForwardOutput out = runner_.self_draft(batch);
    for (std::size_t b = 0; b < active.size(); ++b) {
      drafts[active[b]].push_back(
          runner::argmax(std::span<const float>(out.logits).subspan(b * vocab, vocab)));
    }
  }
  return drafts;
}

}  // namespace mixkv::spec
