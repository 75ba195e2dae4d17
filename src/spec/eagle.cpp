#include "mixkv/spec/eagle.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "mixkv/core/error.hpp"

namespace mixkv::spec {

using runner::argmax;
using runner::ForwardOutput;
using runner::ModelRunner;
using runner::SequenceInput;

EagleDrafter::EagleDrafter(ModelRunner& runner)
    : runner_(runner),
      name_(runner.desc().draft_info && runner.desc().draft_info->kind == model::DraftKind::kMtp
                ? "mtp"
                : "eagle") {
  if (!runner.has_drafter() || runner.has_block_drafter()) {
    throw_invalid(
        "the eagle drafter needs a runner built with an EAGLE-style drafter or MTP layers "
        "(RunnerOptions::draft or mtp)");
  }
}

void EagleDrafter::observe(const DraftContext& ctx, std::int64_t first,
                           std::span<const float> hidden) {
  const Observation o{ctx, first, hidden};
  observe_batch(std::span(&o, 1));
}

// Every request's new positions in one drafter forward: each token [next, num_computed] with
// the target hidden state of the position before it.
void EagleDrafter::observe_batch(std::span<const Observation> observations) {
  const std::int64_t h = runner_.config().hidden_size;
  std::vector<SequenceInput> batch;
  std::vector<float> features;
  std::vector<std::size_t> requests;  // per batch entry
  for (const Observation& o : observations) {
    const DraftContext& ctx = o.ctx;
    State& st = states_[ctx.request];
    if (st.hidden_base + static_cast<std::int64_t>(st.hidden.size()) / h != o.first) {
      // A gap: the prefix before `first` came from the cache (its drafter KV too). Start there;
      // the state before it is unknown, so the first position is fed zeros.
      st.hidden.clear();
      st.hidden_base = o.first;
      st.next = std::max(st.next, o.first);
    }
    st.hidden.insert(st.hidden.end(), o.features.begin(), o.features.end());
    const std::int64_t from = st.next;
    const std::int64_t to = ctx.num_computed;
    if (to < from || to >= static_cast<std::int64_t>(ctx.tokens.size())) continue;
    const auto at = features.size();
    features.resize(at + static_cast<std::size_t>((to - from + 1) * h), 0.0f);
    for (std::int64_t q = from; q <= to; ++q) {
      const std::int64_t row = q - 1 - st.hidden_base;
      if (row < 0 || row >= static_cast<std::int64_t>(st.hidden.size()) / h) continue;
      std::copy_n(st.hidden.begin() + row * h, h,
                  features.begin() + static_cast<std::ptrdiff_t>(at) + (q - from) * h);
    }
    SequenceInput in;
    in.tokens =
        ctx.tokens.subspan(static_cast<std::size_t>(from), static_cast<std::size_t>(to - from + 1));
    in.start = from;
    in.block_tables.assign(ctx.block_tables.begin(), ctx.block_tables.end());
    batch.push_back(std::move(in));
    requests.push_back(ctx.request);
  }
  if (batch.empty()) return;
  const ForwardOutput out = runner_.draft_forward(batch, features);
  const auto vocab = static_cast<std::size_t>(runner_.vocab_size());
  std::size_t row = 0;
  for (std::size_t b = 0; b < batch.size(); ++b) {
    State& st = states_[requests[b]];
    row += batch[b].tokens.size();
    const std::size_t last = row - 1;
    const std::int64_t to = batch[b].start + static_cast<std::int64_t>(batch[b].tokens.size()) - 1;
    st.pending_at = to;
    st.pending = argmax(std::span<const float>(out.logits).subspan(last * vocab, vocab));
    st.pending_hidden.assign(out.hidden.begin() + static_cast<std::ptrdiff_t>(last) * h,
                             out.hidden.begin() + static_cast<std::ptrdiff_t>(last + 1) * h);
    st.next = to + 1;
    // The observed rows end at position to - 1: all consumed. h_to comes with the next call.
    st.hidden.clear();
    st.hidden_base = to;
  }
}

std::vector<TokenId> EagleDrafter::propose(const DraftContext& ctx, int k) {
  return propose_batch(std::span(&ctx, 1), k).front();
}

// The first draft came with observe(); later drafts stand on the drafter's own output in place
// of the target's hidden state, one position of every request per forward. Their slots are
// look-ahead and are rewritten by the next observe().
std::vector<std::vector<TokenId>> EagleDrafter::propose_batch(std::span<const DraftContext> ctxs,
                                                              int k) {
  std::vector<std::vector<TokenId>> drafts(ctxs.size());
  std::vector<std::size_t> active;  // requests with a first draft
  std::vector<float> features;
  for (std::size_t r = 0; r < ctxs.size(); ++r) {
    const auto it = states_.find(ctxs[r].request);
    if (it == states_.end() || k < 1 || it->second.pending_at != ctxs[r].num_computed) continue;
    drafts[r].push_back(it->second.pending);
    features.insert(features.end(), it->second.pending_hidden.begin(),
                    it->second.pending_hidden.end());
    active.push_back(r);
  }
  const auto vocab = static_cast<std::size_t>(runner_.vocab_size());
  for (int i = 1; i < k && !active.empty(); ++i) {
    std::vector<SequenceInput> batch(active.size());
    for (std::size_t b = 0; b < active.size(); ++b) {
      const DraftContext& ctx = ctxs[active[b]];
      batch[b].tokens = std::span<const TokenId>(&drafts[active[b]].back(), 1);
      batch[b].start = ctx.num_computed + i;
      batch[b].block_tables.assign(ctx.block_tables.begin(), ctx.block_tables.end());
    }
    const ForwardOutput out = runner_.draft_forward(batch, features);
    for (std::size_t b = 0; b < active.size(); ++b) {
      drafts[active[b]].push_back(
          argmax(std::span<const float>(out.logits).subspan(b * vocab, vocab)));
    }
    features.assign(out.hidden.begin(), out.hidden.end());
  }
  return drafts;
}

void EagleDrafter::forget(std::size_t request) { states_.erase(request); }

}  // namespace mixkv::spec
