#include "mixkv/spec/dflash.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "mixkv/core/error.hpp"

namespace mixkv::spec {

using runner::argmax;
using runner::ForwardOutput;
using runner::ModelRunner;
using runner::SequenceInput;

DflashDrafter::DflashDrafter(ModelRunner& runner) : runner_(runner) {
  if (!runner.has_block_drafter()) {
    throw_invalid(
        "the dflash drafter needs a runner built with a DFlash drafter (RunnerOptions::draft)");
  }
}

std::vector<TokenId> DflashDrafter::propose(const DraftContext& ctx, int k) {
  return propose_batch(std::span(&ctx, 1), k).front();
}

std::vector<std::vector<TokenId>> DflashDrafter::propose_batch(std::span<const DraftContext> ctxs,
                                                               int k) {
  const int drafts = std::min(k, runner_.block_size() - 1);
  std::vector<std::vector<TokenId>> out(ctxs.size());
  if (drafts < 1 || ctxs.empty()) return out;
  // Each block: the anchor (the last verified token, at num_computed), then the mask tokens.
  std::vector<TokenId> block(static_cast<std::size_t>(drafts) + 1, runner_.mask_token());
  std::vector<std::vector<TokenId>> blocks(ctxs.size(), block);
  std::vector<SequenceInput> batch(ctxs.size());
  for (std::size_t r = 0; r < ctxs.size(); ++r) {
    blocks[r][0] = ctxs[r].tokens.back();
    batch[r].tokens = blocks[r];
    batch[r].start = ctxs[r].num_computed;
    batch[r].block_tables.assign(ctxs[r].block_tables.begin(), ctxs[r].block_tables.end());
  }
  const ForwardOutput fwd = runner_.block_draft(batch);
  // A mask's output is the token at its own position (the block is denoised in place): rows
  // 1..drafts give the drafts for positions start + 1 .. start + drafts; the anchor's is unused.
  const auto vocab = static_cast<std::size_t>(runner_.vocab_size());
  std::size_t row = 0;
  for (std::size_t r = 0; r < ctxs.size(); ++r, row += block.size()) {
    for (std::size_t i = 0; i < static_cast<std::size_t>(drafts); ++i) {
      out[r].push_back(
          argmax(std::span<const float>(fwd.logits).subspan((row + 1 + i) * vocab, vocab)));
    }
  }
  return out;
}

void DflashDrafter::observe(const DraftContext& ctx, std::int64_t first,
                            std::span<const float> features) {
  const Observation o{ctx, first, features};
  observe_batch(std::span(&o, 1));
}

void DflashDrafter::observe_batch(std::span<const Observation> observations) {
  std::vector<SequenceInput> batch;
  std::vector<float> features;
  for (const Observation& o : observations) {
    const std::int64_t n = o.ctx.num_computed - o.first;
    if (n <= 0) continue;
    SequenceInput in;
    in.tokens =
        o.ctx.tokens.subspan(static_cast<std::size_t>(o.first), static_cast<std::size_t>(n));
    in.start = o.first;
    in.block_tables.assign(o.ctx.block_tables.begin(), o.ctx.block_tables.end());
    batch.push_back(std::move(in));
    features.insert(features.end(), o.features.begin(), o.features.end());
  }
  if (!batch.empty()) runner_.draft_context(batch, features);
}

}  // namespace mixkv::spec
