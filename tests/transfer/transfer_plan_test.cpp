// The pull plan, checked on the layout level: after applying it, every byte the decode side's own
// geometry says a token's K/V (its KV-head slice) or a recurrent state occupies holds what the
// prefill side wrote there, and nothing else was written.
#include "mixkv/transfer/transfer_plan.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "mixkv/core/error.hpp"
#include "mixkv/engine/tiny_models.hpp"
#include "transfer/transfer_test_support.hpp"

namespace mixkv::transfer {
namespace {

using ::testing::HasSubstr;
using testing::make_blocks;
using testing::make_side;
using testing::SideOptions;

constexpr std::uint64_t kPlanSeed = 42;

using testing::side;

// Moves a request of `tokens` tokens from p to d (one rank each) and checks it byte for byte.
void expect_exact(const SideOptions& po, const SideOptions& dopt, std::int64_t tokens,
                  std::int64_t first = 0) {
  auto p = make_side(po);
  auto d = make_side(dopt);
  reconcile(p.descriptor, d.descriptor);
  const RequestBlocks pb = make_blocks(p, tokens, 3);
  const RequestBlocks db = make_blocks(d, tokens, 5);
  testing::fill(p, pb, tokens, kPlanSeed);
  const PullPlan plan = plan_pull(p.descriptor, d.descriptor, pb, db, {tokens, first});
  apply_locally(plan, p.tensors(), d.tensors());
  const std::int64_t expected = testing::expected_bytes(d, db, first, tokens);
  EXPECT_GT(expected, 0);
  EXPECT_EQ(plan.bytes, expected);
  EXPECT_EQ(testing::mismatches(d, db, first, tokens, kPlanSeed), 0);
  EXPECT_EQ(testing::touched(d), expected);  // nothing outside the request's KV was written
  EXPECT_EQ(unit_checksums(plan, p.tensors(), true), unit_checksums(plan, d.tensors(), false));
}

TEST(PullPlan, EqualLayoutsMoveWholeKernelPages) {
  const auto o = side("tiny-swa", "tiny-eagle");
  expect_exact(o, o, 300);
  auto p = make_side(o);
  const RequestBlocks b = make_blocks(p, 256, 1);
  const PullPlan plan = plan_pull(p.descriptor, p.descriptor, b, b, {256, 0});
  // Equal layouts: one K run and one V run per 16-token kernel page of a full layer.
  int full_units = 0;
  for (const auto& u : plan.units) {
    if (p.descriptor.layers[static_cast<std::size_t>(u.layer)].name != "layers.1") continue;
    ++full_units;
    EXPECT_EQ(u.run_end - u.run_begin, 2u);
    EXPECT_EQ(plan.runs[u.run_begin].length, p.descriptor.layers[1].k_token_bytes * 16);
  }
  EXPECT_EQ(full_units, 256 / 16);
}

TEST(PullPlan, DifferentBlockSizesAndPolicies) {
  auto d = side("tiny-swa", "tiny-eagle");
  d.block_size = 64;
  d.policy = plan::Policy::kVllm;
  expect_exact(side("tiny-swa", "tiny-eagle"), d, 333);
  expect_exact(d, side("tiny-swa", "tiny-eagle"), 333);
}

TEST(PullPlan, HybridStatesAndDflashDrafter) {
  auto d = side("tiny-hybrid", "tiny-dflash");
  d.block_size = 32;
  expect_exact(side("tiny-hybrid", "tiny-dflash"), d, 200);
  expect_exact(side("tiny-mamba"), side("tiny-mamba"), 77);
  expect_exact(side("tiny-hybrid", std::string(model::kMtpDraft)),
               side("tiny-hybrid", std::string(model::kMtpDraft)), 50);
}

TEST(PullPlan, PrefixHitOnTheDecodeSideSkipsItsTokens) {
  auto d = side("tiny-swa");
  d.block_size = 32;
  expect_exact(side("tiny-swa"), d, 200, 64);
  auto de = side("tiny-swa", "tiny-eagle");
  de.block_size = 32;
  expect_exact(side("tiny-swa", "tiny-eagle"), de, 99, 32);
}

TEST(PullPlan, OneTokenAndNoTokens) {
  expect_exact(side("tiny-swa"), side("tiny-swa"), 1);
  auto p = make_side(side("tiny-swa"));
  const RequestBlocks b = make_blocks(p, 0, 1);
  EXPECT_EQ(plan_pull(p.descriptor, p.descriptor, b, b, {0, 0}).bytes, 0);
}

// TP 1 -> TP n: each decode rank pulls its KV-head slice; TP n -> TP 1: the decode rank pulls
// each prefill rank's heads. Every rank checked against its own geometry.
void expect_tp(int prefill_tp, int decode_tp, std::int64_t tokens,
               const SideOptions& model = side("tiny-swa", "tiny-eagle")) {
  SCOPED_TRACE(::testing::Message()
               << model.model << " TP " << prefill_tp << " -> TP " << decode_tp);
  std::vector<testing::Side> ps;
  std::vector<RequestBlocks> pbs;
  for (int r = 0; r < prefill_tp; ++r) {
    auto o = model;
    o.tp = prefill_tp;
    o.tp_rank = r;
    ps.push_back(make_side(o));
    pbs.push_back(make_blocks(ps.back(), tokens, 2 + r));
    testing::fill(ps.back(), pbs.back(), tokens, kPlanSeed);
  }
  for (int r = 0; r < decode_tp; ++r) {
    auto o = model;
    o.tp = decode_tp;
    o.tp_rank = r;
    o.block_size = 32;
    auto d = make_side(o);
    const RequestBlocks db = make_blocks(d, tokens, 4 + r);
    std::int64_t bytes = 0;
    for (int s = 0; s < prefill_tp; ++s) {
      reconcile(ps[s].descriptor, d.descriptor);
      const PullPlan plan = plan_pull(ps[s].descriptor, d.descriptor, pbs[s], db, {tokens, 0});
      apply_locally(plan, ps[s].tensors(), d.tensors());
      bytes += plan.bytes;
    }
    const std::int64_t expected = testing::expected_bytes(d, db, 0, tokens);
    EXPECT_EQ(bytes, expected) << "decode rank " << r;
    EXPECT_EQ(testing::mismatches(d, db, 0, tokens, kPlanSeed), 0) << "decode rank " << r;
    EXPECT_EQ(testing::touched(d), expected) << "decode rank " << r;
  }
}

TEST(PullPlan, HeterogeneousTensorParallel) {
  expect_tp(1, 2, 150);
  expect_tp(2, 1, 150);
  expect_tp(1, 4, 40);  // 2 KV heads over 4 ranks: replicated, each pulled once per rank
  expect_tp(4, 2, 40);
}

// An HND side (trtllm-gen's pages: each KV head's tokens side by side) and an NHD one, either
// way, and across TP sizes: every byte lands where the decode side's own geometry says. A whole
// unit hashes as the prefill side's own plan does, whatever the decode side's layout, so the
// checksums the prefill side computes at its offer hold.
TEST(PullPlan, HndAndNhdPagesEitherWay) {
  auto nhd = side("tiny-swa", "tiny-eagle");
  nhd.kv_dtype = DType::kBfloat16;
  auto hnd = nhd;
  hnd.backend = backend::Backend::kFlashinferTrtllm;
  ASSERT_TRUE(make_side(hnd).geometry.layers.at(1).hnd());
  for (const auto& [p, d] : {std::pair{nhd, hnd}, std::pair{hnd, nhd}, std::pair{hnd, hnd}}) {
    SCOPED_TRACE(::testing::Message() << "prefill " << backend::to_string(p.backend) << ", decode "
                                      << backend::to_string(d.backend));
    expect_exact(p, d, 300);
    expect_exact(p, d, 77, 32);
    auto ps = make_side(p);
    auto ds = make_side(d);
    const RequestBlocks pb = make_blocks(ps, 200, 3);
    const RequestBlocks db = make_blocks(ds, 200, 5);
    testing::fill(ps, pb, 200, kPlanSeed);
    const PullPlan self = plan_pull(ps.descriptor, ps.descriptor, pb, pb, {200, 0});
    const PullPlan pair = plan_pull(ps.descriptor, ds.descriptor, pb, db, {200, 0});
    const auto self_sums = unit_checksums(self, ps.tensors(), true);
    const auto pair_sums = unit_checksums(pair, ps.tensors(), true);
    ASSERT_EQ(self.units.size(), pair.units.size());
    for (std::size_t u = 0; u < pair.units.size(); ++u) {
      if (pair.units[u].whole) {
        EXPECT_EQ(pair_sums[u], self_sums[u]) << "unit " << u;
      }
    }
  }
  expect_tp(1, 2, 150, hnd);
  expect_tp(2, 1, 150, hnd);
}

// tiny-mamba with a single B/C group, which TP replicates on every rank (n_groups = 1).
SideOptions mamba_one_group() {
  const engine::TinyModel* m = engine::find_tiny_model("tiny-mamba");
  std::string config(m->config_json);
  const std::string groups = "\"n_groups\": 2";
  config.replace(config.find(groups), groups.size(), "\"n_groups\": 1");
  SideOptions o = side("tiny-mamba-1-group");
  o.config = config;
  return o;
}

// Recurrent states across TP sizes: each decode rank gets its share of the recurrent heads (a
// GDN conv's q, k and v channels and its temporal state; a Mamba2 conv's x, B and C channels
// and its SSM state), with the attention layers' KV heads and the drafter's KV.
TEST(PullPlan, HeterogeneousTensorParallelSlicesRecurrentStates) {
  expect_tp(1, 2, 90, side("tiny-hybrid", "tiny-dflash"));
  expect_tp(2, 1, 90, side("tiny-hybrid", "tiny-dflash"));
  expect_tp(1, 2, 40, side("tiny-mamba"));
  expect_tp(2, 1, 40, side("tiny-mamba"));
  expect_tp(1, 4, 40, mamba_one_group());  // B/C replicated, KV heads replicated
  expect_tp(4, 2, 40, mamba_one_group());
}

// The split follows the model's sharding, read from the descriptor of each rank.
TEST(PullPlan, StateSplitsFollowTheModelsSharding) {
  auto o = side("tiny-hybrid");
  o.tp = 2;
  const auto hybrid = make_side(o);
  const LayerLayout& gdn = hybrid.descriptor.layers.at(0);
  ASSERT_EQ(gdn.kind, "gdn");
  // linear_num_key_heads 2, linear_num_value_heads 4, head dims 16: per rank q 16, k 16, v 32.
  ASSERT_EQ(gdn.state.at(0).name, "conv");
  EXPECT_EQ(gdn.state[0].split_dim, 1);
  EXPECT_EQ(gdn.state[0].segments,
            (std::vector<StateSegment>{{16, false}, {16, false}, {32, false}}));
  EXPECT_EQ(gdn.state.at(1).split_dim, 0);  // temporal: [v heads, k dim, v dim]
  EXPECT_EQ(gdn.state[1].segments, (std::vector<StateSegment>{{2, false}}));
  auto m = mamba_one_group();
  m.tp = 2;
  const auto mamba = make_side(m);
  const LayerLayout& mixer = mamba.descriptor.layers.at(0);
  ASSERT_EQ(mixer.kind, "mamba2");
  // 8 heads of 8 over 2 ranks: x 32 channels; one group of state 16, on every rank.
  EXPECT_EQ(mixer.state.at(0).segments,
            (std::vector<StateSegment>{{32, false}, {16, true}, {16, true}}));
  EXPECT_EQ(mixer.state.at(1).segments, (std::vector<StateSegment>{{4, false}}));
}

// MLA: every rank holds the whole latent; a decode rank pulls it once, from prefill rank 0.
TEST(PullPlan, MlaLatentIsReplicatedAndPulledOnce) {
  auto o = side("deepseek-v3", std::string(model::kMtpDraft));
  o.backend = backend::Backend::kFlashMla;
  o.memory = std::int64_t{20} << 20;
  o.max_model_len = 128;
  constexpr std::int64_t kTokens = 70;
  std::vector<testing::Side> ps;
  std::vector<RequestBlocks> pbs;
  for (int r = 0; r < 2; ++r) {
    auto po = o;
    po.tp = 2;
    po.tp_rank = r;
    ps.push_back(make_side(po));
    pbs.push_back(make_blocks(ps.back(), kTokens, 1 + r));
    testing::fill(ps.back(), pbs.back(), kTokens, kPlanSeed);
  }
  auto d = make_side(o);
  ASSERT_EQ(d.descriptor.layers.at(0).total_kv_heads, 1);
  const RequestBlocks db = make_blocks(d, kTokens, 3);
  EXPECT_GT(plan_pull(ps[0].descriptor, d.descriptor, pbs[0], db, {kTokens, 0}).bytes, 0);
  EXPECT_EQ(plan_pull(ps[1].descriptor, d.descriptor, pbs[1], db, {kTokens, 0}).bytes, 0);
  apply_locally(plan_pull(ps[0].descriptor, d.descriptor, pbs[0], db, {kTokens, 0}),
                ps[0].tensors(), d.tensors());
  EXPECT_EQ(testing::mismatches(d, db, 0, kTokens, kPlanSeed), 0);
  EXPECT_EQ(testing::touched(d), testing::expected_bytes(d, db, 0, kTokens));
}

TEST(PullPlan, RefusesBlocksThatDoNotHoldTheTokens) {
  auto p = make_side(side("tiny-swa"));
  RequestBlocks b = make_blocks(p, 100, 1);
  EXPECT_THAT(
      [&] {
        plan_pull(p.descriptor, p.descriptor, b, b, {200, 0});
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("do not hold the request's 200 tokens")));
  RequestBlocks null_block = b;
  null_block.groups.at(0).back() = 0;  // group 0 may be sliding: its first block is not read
  EXPECT_THAT(
      [&] {
        plan_pull(p.descriptor, p.descriptor, null_block, b, {100, 0});
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("is null")));
  RequestBlocks past = b;
  past.groups.at(0).back() = 1 << 30;
  EXPECT_THAT(
      [&] {
        plan_pull(p.descriptor, p.descriptor, past, b, {100, 0});
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("falls outside a tensor")));
}

}  // namespace
}  // namespace mixkv::transfer
