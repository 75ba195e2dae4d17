// Prompt lookup (n-gram) drafting, as vLLM's "ngram" method and llama.cpp's lookup decoding:
// over the prompt and the generated text, find the earlier occurrence that matches the longest
// suffix of the tokens (at least min_n, at most max_n; the most recent among equally long ones,
// passing over one followed by a stop token: the end of a quoted message) and propose what
// followed it, read on through its own proposal so a repeating cycle yields k tokens; with no
// such match, a last token whose earlier occurrences all went on alike (one seen once, say)
// proposes what followed the latest. A copy in progress is followed across steps, across a
// one-token edit (a renamed variable), and across an edit that inserted or dropped a few tokens
// (a corrected spelling that tokenizes longer), where the text's last token reappears near the
// place the copy had reached.
// Each draft comes with the drafter's own estimate that it is accepted, learned from how its
// earlier proposals fared against the tokens that followed, by the length of the match it
// extends, and scaled for each request by how its own proposals fared against those estimates
// (a reply that copies nothing falls back towards plain decoding within a few proposals, whatever
// the other requests do): the scheduler verifies only the drafts that pay.
#pragma once

#include <array>
#include <cstdint>
#include <unordered_map>

#include "mixkv/spec/drafter.hpp"

namespace mixkv::spec {

// Default match lengths. A one-token match (" the") is chance on new text, right about one time
// in six on SmolLM2's answers, and proposing it often displaced a longer match's resumption; from
// two tokens on the estimates (below) decide what is worth verifying. Only where nothing longer
// (nor a copy to resume) is found does one token count, and only one whose every earlier
// occurrence went on with the same token (a name seen once, a number: rarely chance), at the
// one-token estimates. Longer matches win over shorter ones (a copy in progress beats a phrase
// that recurs), up to kNgramMaxMatch.
inline constexpr int kNgramMinMatch = 2;
inline constexpr int kNgramMaxMatch = 32;

class NgramDrafter final : public Drafter {
 public:
  // The estimates are kept by the length of the proposal's match, 0 (a proposal that resumes a
  // copy after an edit) to kLengths - 1 (and longer), and by the draft's position in the
  // proposal (kPositions - 1 and later share one).
  static constexpr int kLengths = 8;
  static constexpr int kPositions = 4;
  // Where a copy is looked for again after an edit, relative to the place it had reached: from
  // kResyncBefore tokens before it (the edit dropped tokens) to kResyncAfter after (it inserted
  // them). Measured on SmolLM2's answers (docs/spec.md): a narrower window finds fewer of the
  // spelling corrections, a wider one more chance matches.
  static constexpr int kResyncBefore = 2;
  static constexpr int kResyncAfter = 8;

  NgramDrafter(int min_n = kNgramMinMatch, int max_n = kNgramMaxMatch);
  std::string name() const override { return "ngram"; }
  bool drafts_for_free() const override { return true; }
  std::vector<TokenId> propose(const DraftContext& ctx, int k) override;
  std::span<const double> confidence(std::size_t request) const override;
  void forget(std::size_t request) override;

  // P(draft `position` of a proposal whose match is `length` tokens long is accepted, given that
  // the drafts before it were): the prior, moved by every outcome seen so far.
  double estimate(int length, int position) const;
  // How `request`'s first drafts fared against the estimates they were proposed with: (its hits
  // + kRecordPrior) / (their estimates' sum + kRecordPrior), recent proposals weighing most
  // (kRecordDecay per proposal). Its proposals' first estimate is scaled by it (so the value of
  // their whole chain); 1 for a request with nothing scored yet.
  double request_factor(std::size_t request) const;
  static constexpr double kRecordPrior = 0.5;
  static constexpr double kRecordDecay = 0.9;

 private:
  // A request's last proposal, scored against the tokens that follow it at its next propose().
  struct Pending {
    std::int64_t at = 0;      // the text's length when proposed: drafts[j] predicts tokens[at + j]
    std::int64_t source = 0;  // where drafts[0] was read from (tokens[source])
    int length = 0;           // the match's length (bucketed)
    std::vector<TokenId> drafts;
    std::vector<double> confidence;
    double first_estimate = 0;  // estimate(length, 0), before the request's factor
  };
  // The place a request's last copy had reached: tokens[source] lined up with the end of a text
  // of `size` tokens, so tokens[source + n] with the end of one n tokens longer.
  struct Anchor {
    std::int64_t source = 0;
    std::int64_t size = 0;
  };
  // A request's first drafts so far, decayed: hits, and the estimates they were proposed with.
  struct Record {
    double hits = 0;
    double expected = 0;
  };
  void score(const Pending& p, std::span<const TokenId> tokens, Record& record);
  int min_n_;
  int max_n_;
  std::unordered_map<std::size_t, Pending> pending_;
  std::unordered_map<std::size_t, Anchor> anchors_;
  std::unordered_map<std::size_t, Record> records_;
  std::array<std::array<double, kPositions>, kLengths> hits_{};
  std::array<std::array<double, kPositions>, kLengths> trials_{};
};

}  // namespace mixkv::spec
