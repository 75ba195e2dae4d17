#include "mixkv/spec/ngram.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>

#include "mixkv/core/error.hpp"

namespace mixkv::spec {
namespace {

// What a draft's acceptance is before anything is seen, by the match length of its proposal
// (rows; 0: a copy resumed after a one-token edit) and its position in the proposal (columns),
// given the drafts before it were accepted. Measured on SmolLM2-135M's greedy answers to
// bench-generate's prompt set, then smoothed (docs/spec.md): a one- or two-token match is
// mostly chance (and a draft after it that passed is still often the last), from three tokens
// on a match is mostly a copy.
constexpr std::array<std::array<double, NgramDrafter::kPositions>, NgramDrafter::kLengths> kPrior =
    {{{0.30, 0.40, 0.45, 0.50},
      {0.17, 0.45, 0.50, 0.55},
      {0.35, 0.50, 0.55, 0.60},
      {0.70, 0.65, 0.70, 0.75},
      {0.78, 0.75, 0.85, 0.85},
      {0.78, 0.78, 0.85, 0.85},
      {0.88, 0.88, 0.90, 0.90},
      {0.95, 0.95, 0.95, 0.95}}};
// The prior counts as this many outcomes: a request's own few dozen move it within a few steps.
constexpr double kPriorWeight = 4.0;
// Outcomes kept per length (older ones halve away past it), so a server's estimates follow
// what its recent requests do.
constexpr double kMaxTrials = 256.0;

// A one-token edit is looked for only in a copy followed this far (shorter ones are mostly
// chance matches, whose next token is no edit).
constexpr int kMinEditedCopy = 4;

int bucket(std::int64_t length) {
  return static_cast<int>(std::min<std::int64_t>(length, NgramDrafter::kLengths - 1));
}

}  // namespace

NgramDrafter::NgramDrafter(int min_n, int max_n) : min_n_(min_n), max_n_(max_n) {
  if (min_n < 1 || max_n < min_n) {
    throw_invalid(fmt::format("ngram drafter: n from {} to {} is not a range of positive lengths",
                              min_n, max_n));
  }
}

double NgramDrafter::estimate(int length, int position) const {
  const auto l = static_cast<std::size_t>(std::clamp(length, 0, kLengths - 1));
  const auto j = static_cast<std::size_t>(std::clamp(position, 0, kPositions - 1));
  return (hits_[l][j] + kPriorWeight * kPrior[l][j]) / (trials_[l][j] + kPriorWeight);
}

double NgramDrafter::request_factor(std::size_t request) const {
  const auto it = records_.find(request);
  if (it == records_.end()) return 1.0;
  return (it->second.hits + kRecordPrior) / (it->second.expected + kRecordPrior);
}

std::span<const double> NgramDrafter::confidence(std::size_t request) const {
  const auto it = pending_.find(request);
  return it == pending_.end() ? std::span<const double>{} : it->second.confidence;
}

void NgramDrafter::forget(std::size_t request) {
  pending_.erase(request);
  anchors_.erase(request);
  records_.erase(request);
}

// Every draft of the last proposal whose token is now known is an outcome, verified or not
// (greedy verification accepts exactly the tokens that follow): the estimates learn from drafts
// the policy did not pay to verify, so a length judged poor is not judged so for ever.
void NgramDrafter::score(const Pending& p, std::span<const TokenId> tokens, Record& record) {
  for (std::size_t j = 0; j < p.drafts.size(); ++j) {
    const std::int64_t at = p.at + static_cast<std::int64_t>(j);
    if (at >= std::ssize(tokens)) break;
    const auto l = static_cast<std::size_t>(p.length);
    const auto c = std::min<std::size_t>(j, kPositions - 1);
    const bool hit = tokens[static_cast<std::size_t>(at)] == p.drafts[j];
    if (j == 0) {
      record.hits = kRecordDecay * record.hits + (hit ? 1.0 : 0.0);
      record.expected = kRecordDecay * record.expected + p.first_estimate;
    }
    if (trials_[l][c] >= kMaxTrials) {
      trials_[l][c] /= 2;
      hits_[l][c] /= 2;
    }
    trials_[l][c] += 1;
    hits_[l][c] += hit ? 1 : 0;
    if (!hit) break;  // later drafts are conditional on this one
  }
}

std::vector<TokenId> NgramDrafter::propose(const DraftContext& ctx, int k) {
  const std::span<const TokenId> tokens = ctx.tokens;
  const auto size = static_cast<std::int64_t>(tokens.size());
  const auto token = [&](std::int64_t i) { return tokens[static_cast<std::size_t>(i)]; };
  // How far back the text before `end` agrees with the end of the text, up to max_n.
  const auto match = [&](std::int64_t end) {
    std::int64_t len = 0;
    while (len < max_n_ && end - 1 - len >= 0 && token(end - 1 - len) == token(size - 1 - len)) {
      ++len;
    }
    return len;
  };

  // The last proposal: score it, and see where its span goes on. When the text followed it up to
  // a last token that replaced one of its tokens (an edit), the copy resumes after that token.
  std::int64_t follow = -1;  // the continuation of the last span, if the text followed it
  std::int64_t resume = -1;  // where the copy resumes after a one-token edit
  if (const auto it = pending_.find(ctx.request); it != pending_.end()) {
    const Pending& p = it->second;
    score(p, tokens, records_[ctx.request]);
    const std::int64_t shift = size - p.at;
    if (shift >= 1 && shift <= std::ssize(p.drafts)) {
      bool followed = true;
      for (std::int64_t j = 0; j + 1 < shift && followed; ++j) {
        followed = token(p.at + j) == p.drafts[static_cast<std::size_t>(j)];
      }
      const bool kept = token(size - 1) == p.drafts[static_cast<std::size_t>(shift - 1)];
      if (followed && p.source + shift < p.at) {
        if (kept) {
          follow = p.source + shift;
        } else if (p.length + shift - 1 >= kMinEditedCopy) {
          // An edit is told from a chance match by the length of the copy it interrupts.
          resume = p.source + shift;
        }
      }
    }
    pending_.erase(it);
  }

  // An occurrence followed by a stop token ends a message (the prompt's quoted code, then the
  // chat's end of turn): an answer that repeats its last words goes on instead, as one that
  // opens a code block repeats the prompt's opening fence, not its closing one.
  const auto ends_message = [&](std::int64_t end) {
    return std::find(ctx.stop_tokens.begin(), ctx.stop_tokens.end(), token(end)) !=
           ctx.stop_tokens.end();
  };

  // Every earlier occurrence of the text's end, latest first: the longest match wins, a later
  // one on a tie, and the followed span on a tie with it (a copy in progress is not dropped for
  // a recent repeat of the same words).
  std::int64_t best_end = -1;  // the token after the chosen occurrence
  std::int64_t best_len = 0;
  for (std::int64_t end = size - 1; end >= min_n_; --end) {
    const std::int64_t len = match(end);
    if (len >= min_n_ && len > best_len && !ends_message(end)) {
      best_len = len;
      best_end = end;
      if (len == max_n_) break;
    }
  }
  if (follow >= 0 && follow < size && match(follow) >= std::max<std::int64_t>(best_len, min_n_)) {
    best_end = follow;
    best_len = match(follow);
  }
  // A resumed copy against the lookup's match, by what each has been worth.
  if (resume >= 0 && (best_end < 0 || estimate(0, 0) > estimate(bucket(best_len), 0))) {
    best_end = resume;
    best_len = 0;
  }
  if (best_len >= min_n_) {
    anchors_[ctx.request] = {best_end, size};
  } else if (const auto a = anchors_.find(ctx.request); a != anchors_.end()) {
    // No match of min_n tokens (or only a resumed copy): an edit may have inserted or dropped
    // a few tokens. The text's last token near the place the copy had reached, the nearest
    // occurrence (the earlier on a tie), resumes it there.
    const std::int64_t reached = a->second.source + (size - a->second.size);
    std::int64_t found = -1;
    for (std::int64_t end = std::max<std::int64_t>(1, reached - kResyncBefore);
         end <= std::min(size - 1, reached + kResyncAfter); ++end) {
      if (token(end - 1) == token(size - 1) &&
          (found < 0 || std::abs(end - reached) < std::abs(found - reached))) {
        found = end;
      }
    }
    if (found >= 0) {
      best_end = found;
      best_len = 0;
      a->second = {found, size};
    }
  }
  if (best_end < 0 && min_n_ > 1) {
    // Nothing else: a last token whose every earlier occurrence went on with the same token (an
    // identifier seen once, a name always followed by its call's parenthesis; not " the", which
    // goes on every way) is seldom chance: what followed its latest occurrence, at the one-token
    // estimates.
    std::int64_t latest = -1;
    bool agree = true;
    for (std::int64_t end = size - 1; end >= 1 && agree; --end) {
      if (token(end - 1) != token(size - 1)) continue;
      if (latest < 0) {
        latest = end;
      } else {
        agree = token(end) == token(latest);
      }
    }
    if (latest >= 0 && agree && !ends_message(latest)) {
      best_end = latest;
      best_len = 1;
    }
  }
  if (best_end < 0) return {};

  // What followed, read on into the proposal itself where it runs past the end (a cycle).
  Pending p;
  p.at = size;
  p.source = best_end;
  p.length = bucket(best_len);
  p.first_estimate = estimate(p.length, 0);
  const auto limit = std::max(0, std::min(k, ctx.max_drafts));
  for (std::int64_t i = 0; i < limit; ++i) {
    const std::int64_t at = best_end + i;
    p.drafts.push_back(at < size ? token(at) : p.drafts[static_cast<std::size_t>(at - size)]);
    p.confidence.push_back(estimate(p.length, static_cast<int>(i)));
  }
  // The request's own record scales the first draft's estimate, and so the whole chain's value.
  if (!p.confidence.empty()) {
    p.confidence[0] = std::min(1.0, p.confidence[0] * request_factor(ctx.request));
  }
  std::vector<TokenId> out = p.drafts;
  if (!out.empty()) pending_[ctx.request] = std::move(p);
  return out;
}

}  // namespace mixkv::spec
