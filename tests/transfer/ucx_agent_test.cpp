// The UCX agents in one process (the prefill agent's worker on its own thread, the decode
// agent's on the test's): byte-for-byte pulls over TCP and shared memory, refusals, a corrupt
// page, lease expiry, and heterogeneous TP with the real transport.
#include "mixkv/transfer/ucx_agent.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "mixkv/cache/kv_cache_manager.hpp"
#include "mixkv/core/error.hpp"
#include "transfer/transfer_test_support.hpp"

namespace mixkv::transfer {
namespace {

using ::testing::HasSubstr;
using testing::make_blocks;
using testing::make_side;
using testing::SideOptions;
using namespace std::chrono_literals;

constexpr std::uint64_t kAgentSeed = 7;

using testing::side;

AgentOptions agent_options(std::string transports) {
  AgentOptions a;
  // UCX 1.13's shared-memory transports cannot report a dead peer (see AgentOptions).
  a.peer_failure_detection = transports.find("posix") == std::string::npos;
  a.transports = std::move(transports);
  a.timeout = 10s;
  return a;
}

// Waits (bounded) for the prefill agent to release something.
std::vector<Release> wait_released(PrefillAgent& p, std::chrono::milliseconds limit = 5s) {
  const auto until = std::chrono::steady_clock::now() + limit;
  std::vector<Release> out;
  while (out.empty() && std::chrono::steady_clock::now() < until) {
    out = p.take_released();
    if (out.empty()) std::this_thread::sleep_for(1ms);
  }
  return out;
}

struct Case {
  const char* transports;
  SideOptions prefill;
  SideOptions decode;
  std::int64_t tokens;
};

void expect_pull(const Case& c) {
  SCOPED_TRACE(c.transports);
  auto p = make_side(c.prefill);
  auto d = make_side(c.decode);
  const RequestBlocks pb = make_blocks(p, c.tokens, 2);
  const RequestBlocks db = make_blocks(d, c.tokens, 9);
  testing::fill(p, pb, c.tokens, kAgentSeed);
  PrefillAgent prefill(p.descriptor, p.tensors(), agent_options(c.transports));
  DecodeAgent decode(d.descriptor, d.tensors(), agent_options(c.transports));
  decode.connect("127.0.0.1", prefill.port());
  prefill.offer(11, pb, c.tokens);
  EXPECT_EQ(prefill.num_pinned(), 1u);
  const PullResult r = decode.pull(11, db, {c.tokens, 0});
  ASSERT_TRUE(r.ok()) << to_string(r.reason) << ": " << r.message;
  const std::int64_t expected = testing::expected_bytes(d, db, 0, c.tokens);
  EXPECT_EQ(r.bytes, expected);
  EXPECT_EQ(testing::mismatches(d, db, 0, c.tokens, kAgentSeed), 0);
  EXPECT_EQ(testing::touched(d), expected);
  EXPECT_EQ(wait_released(prefill), (std::vector<Release>{{11, FailureReason::kNone}}));
  EXPECT_EQ(prefill.num_pinned(), 0u);
}

TEST(UcxAgent, PullsByteForByteOverTcp) {
  auto d = side("tiny-hybrid", "tiny-dflash");
  d.block_size = 32;
  d.policy = plan::Policy::kVllm;
  expect_pull({"tcp", side("tiny-hybrid", "tiny-dflash"), d, 300});
}

TEST(UcxAgent, PullsByteForByteOverSharedMemory) {
  auto d = side("tiny-swa", "tiny-eagle");
  d.block_size = 64;
  expect_pull({"posix,self", side("tiny-swa", "tiny-eagle"), d, 257});
  expect_pull({"posix,self", side("tiny-mamba"), side("tiny-mamba"), 99});
}

// The decode side computes the last prompt token itself (N - 1 tokens pulled) and already holds
// the first 32 from a prefix hit; asking for more than was prefilled is refused.
TEST(UcxAgent, PrefixHitAndTheLastPromptTokenLeftToTheDecodeSide) {
  auto po = side("tiny-swa", "tiny-eagle");
  auto dopt = po;
  dopt.block_size = 32;
  auto p = make_side(po);
  auto d = make_side(dopt);
  const RequestBlocks pb = make_blocks(p, 100, 1);
  const RequestBlocks db = make_blocks(d, 100, 2);
  testing::fill(p, pb, 100, kAgentSeed);
  PrefillAgent prefill(p.descriptor, p.tensors(), agent_options("tcp"));
  DecodeAgent decode(d.descriptor, d.tensors(), agent_options("tcp"));
  decode.connect("127.0.0.1", prefill.port());
  prefill.offer(4, pb, 100);
  const PullResult too_many = decode.pull(4, db, {101, 0});
  EXPECT_EQ(too_many.reason, FailureReason::kRefused);
  EXPECT_EQ(testing::touched(d), 0);
  prefill.offer(5, pb, 100);
  const PullResult r = decode.pull(5, db, {99, 32});
  ASSERT_TRUE(r.ok()) << r.message;
  EXPECT_EQ(testing::mismatches(d, db, 32, 99, kAgentSeed), 0);
  EXPECT_EQ(testing::touched(d), testing::expected_bytes(d, db, 32, 99));
  // Request 5 is released; request 4 (asked wrongly) stays offered for a good fetch until its
  // lease ends.
  EXPECT_EQ(wait_released(prefill), (std::vector<Release>{{5, FailureReason::kNone}}));
  EXPECT_EQ(prefill.num_pinned(), 1u);
}

TEST(UcxAgent, HandshakeRefusesAnotherModelOnBothSides) {
  auto p = make_side(side("tiny-swa"));
  auto d = make_side(side("tiny-hybrid"));
  PrefillAgent prefill(p.descriptor, p.tensors(), agent_options("tcp"));
  DecodeAgent decode(d.descriptor, d.tensors(), agent_options("tcp"));
  EXPECT_THAT([&] { decode.connect("127.0.0.1", prefill.port()); },
              ::testing::ThrowsMessage<Error>(HasSubstr("KV transfer refused: model_id differs")));
  EXPECT_EQ(decode.num_peers(), 0u);
  EXPECT_EQ(prefill.num_peers(), 0u);
}

TEST(UcxAgent, UnknownRequestFailsCleanly) {
  auto p = make_side(side("tiny-swa"));
  PrefillAgent prefill(p.descriptor, p.tensors(), agent_options("tcp"));
  auto d = make_side(side("tiny-swa"));
  AgentOptions o = agent_options("tcp");
  o.timeout = 300ms;
  DecodeAgent decode(d.descriptor, d.tensors(), o);
  decode.connect("127.0.0.1", prefill.port());
  const PullResult r = decode.pull(5, make_blocks(d, 10), {10, 0});
  EXPECT_EQ(r.reason, FailureReason::kTimeout);  // never offered: the fetch waits, then times out
  EXPECT_EQ(prefill.num_pinned(), 0u);
}

TEST(UcxAgent, PlantedCorruptPageIsCaughtByItsChecksum) {
  auto p = make_side(side("tiny-swa"));
  auto d = make_side(side("tiny-swa"));
  const RequestBlocks pb = make_blocks(p, 100, 1);
  testing::fill(p, pb, 100, kAgentSeed);
  AgentOptions o = agent_options("tcp");
  // Once the prefill side hashed its pages (the offer came), before the gets: one byte of the
  // last token's K of layers.1 changes there, so what lands differs from what was hashed, as a
  // bad link would make it.
  const RequestBlocks db = make_blocks(d, 100, 4);
  const layout::LayerGeometry& layer = p.geometry.layer("layers.1");
  const layout::TokenLocation loc =
      layout::locate_token(layer, pb.groups.at(static_cast<std::size_t>(layer.kv_cache_group)), 99);
  o.after_offer = [&] {
    p.storage[static_cast<std::size_t>(layer.tensor)][static_cast<std::size_t>(loc.k_offset)] ^=
        std::byte{1};
  };
  PrefillAgent prefill(p.descriptor, p.tensors(), agent_options("tcp"));
  DecodeAgent decode(d.descriptor, d.tensors(), o);
  decode.connect("127.0.0.1", prefill.port());
  prefill.offer(3, pb, 100);
  const PullResult r = decode.pull(3, db, {100, 0});
  EXPECT_EQ(r.reason, FailureReason::kChecksumMismatch);
  EXPECT_THAT(r.message, HasSubstr("layer layers.1 tokens [96, 100)"));
  EXPECT_EQ(wait_released(prefill), (std::vector<Release>{{3, FailureReason::kChecksumMismatch}}));
}

TEST(UcxAgent, LeaseExpiryFreesTheBlocksOfAnUnreadRequest) {
  auto p = make_side(side("tiny-hybrid"));
  cache::KvCacheManager manager(p.plan, 0);
  const cache::RequestId id(1);
  std::vector<cache::TokenId> prompt(100, 5);
  manager.add_request(id, prompt);
  ASSERT_TRUE(manager.admit(id, 0).has_value());
  RequestBlocks blocks;
  for (std::size_t g = 0; g < p.plan.groups.size(); ++g) {
    blocks.groups.emplace_back();
    for (auto b : manager.block_table(id, static_cast<int>(g)))
      blocks.groups.back().push_back(b.value());
  }
  EXPECT_GT(manager.pool().num_used(), 0);
  AgentOptions o = agent_options("tcp");
  o.lease = 100ms;
  PrefillAgent prefill(p.descriptor, p.tensors(), o);
  prefill.offer(1, blocks, 100);
  const auto released = wait_released(prefill, 3s);
  ASSERT_EQ(released, (std::vector<Release>{{1, FailureReason::kLeaseExpired}}));
  manager.free(id);
  EXPECT_EQ(manager.pool().num_used(), 0);
  EXPECT_EQ(manager.check_invariants(), "");
}

TEST(UcxAgent, ReaderPastTheLeaseDiscardsWhatItRead) {
  auto p = make_side(side("tiny-swa"));
  auto d = make_side(side("tiny-swa"));
  const RequestBlocks pb = make_blocks(p, 64, 1);
  testing::fill(p, pb, 64, kAgentSeed);
  AgentOptions po = agent_options("tcp");
  po.lease = 100ms;
  AgentOptions dopt = agent_options("tcp");
  dopt.after_offer = [] { std::this_thread::sleep_for(400ms); };  // silent: no heartbeats
  PrefillAgent prefill(p.descriptor, p.tensors(), po);
  DecodeAgent decode(d.descriptor, d.tensors(), dopt);
  decode.connect("127.0.0.1", prefill.port());
  prefill.offer(8, pb, 64);
  const PullResult r = decode.pull(8, make_blocks(d, 64, 3), {64, 0});
  EXPECT_EQ(r.reason, FailureReason::kLeaseExpired) << r.message;
  EXPECT_EQ(wait_released(prefill), (std::vector<Release>{{8, FailureReason::kLeaseExpired}}));
}

// GDN states (their share of the recurrent heads), full-attention KV heads and the DFlash
// drafter's KV, sliced between TP 1 and TP 2 over UCX.
TEST(UcxAgent, TensorParallelOneToTwoAndTwoToOne) {
  constexpr std::int64_t kTokens = 150;
  auto o1 = side("tiny-hybrid", "tiny-dflash");
  auto o2 = o1;
  o2.tp = 2;
  o2.block_size = 32;
  // TP 1 -> TP 2: one prefill rank, read by two decode ranks.
  {
    auto p = make_side(o1);
    const RequestBlocks pb = make_blocks(p, kTokens, 1);
    testing::fill(p, pb, kTokens, kAgentSeed);
    PrefillAgent prefill(p.descriptor, p.tensors(), agent_options("tcp"));
    prefill.offer(1, pb, kTokens, 2);
    for (int r = 0; r < 2; ++r) {
      o2.tp_rank = r;
      auto d = make_side(o2);
      const RequestBlocks db = make_blocks(d, kTokens, 3 + r);
      DecodeAgent decode(d.descriptor, d.tensors(), agent_options("tcp"));
      decode.connect("127.0.0.1", prefill.port());
      const PullResult res = decode.pull(1, db, {kTokens, 0});
      ASSERT_TRUE(res.ok()) << res.message;
      EXPECT_EQ(testing::mismatches(d, db, 0, kTokens, kAgentSeed), 0) << "rank " << r;
      EXPECT_EQ(testing::touched(d), testing::expected_bytes(d, db, 0, kTokens)) << "rank " << r;
      EXPECT_EQ(prefill.num_pinned(), r == 0 ? 1u : 0u);  // freed only after both readers
    }
    EXPECT_EQ(wait_released(prefill), (std::vector<Release>{{1, FailureReason::kNone}}));
  }
  // TP 2 -> TP 1: one decode rank pulls each prefill rank's heads.
  {
    std::vector<testing::Side> ps;
    std::vector<std::unique_ptr<PrefillAgent>> agents;
    ps.reserve(2);
    for (int r = 0; r < 2; ++r) {
      o2.tp_rank = r;
      ps.push_back(make_side(o2));
      const RequestBlocks pb = make_blocks(ps.back(), kTokens, 2 + r);
      testing::fill(ps.back(), pb, kTokens, kAgentSeed);
      agents.push_back(std::make_unique<PrefillAgent>(ps.back().descriptor, ps.back().tensors(),
                                                      agent_options("tcp")));
      agents.back()->offer(2, pb, kTokens);
    }
    auto d = make_side(o1);
    const RequestBlocks db = make_blocks(d, kTokens, 5);
    DecodeAgent decode(d.descriptor, d.tensors(), agent_options("tcp"));
    for (auto& a : agents) decode.connect("127.0.0.1", a->port());
    const PullResult res = decode.pull(2, db, {kTokens, 0});
    ASSERT_TRUE(res.ok()) << res.message;
    EXPECT_EQ(testing::mismatches(d, db, 0, kTokens, kAgentSeed), 0);
    EXPECT_EQ(testing::touched(d), testing::expected_bytes(d, db, 0, kTokens));
    for (auto& a : agents)
      EXPECT_EQ(wait_released(*a), (std::vector<Release>{{2, FailureReason::kNone}}));
  }
}

}  // namespace
}  // namespace mixkv::transfer
