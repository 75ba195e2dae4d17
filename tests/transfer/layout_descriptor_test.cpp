// The layout descriptor: JSON round trip, what reconcile() accepts and what it refuses.
#include "mixkv/transfer/layout_descriptor.hpp"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "mixkv/core/error.hpp"
#include "mixkv/model/describe.hpp"
#include "transfer/transfer_test_support.hpp"

namespace mixkv::transfer {
namespace {

using ::testing::HasSubstr;
using testing::make_side;
using testing::SideOptions;

using testing::side;

std::string refusal(const LayoutDescriptor& p, const LayoutDescriptor& d) {
  try {
    reconcile(p, d);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidInput);
    return e.what();
  }
  return "";
}

TEST(LayoutDescriptor, JsonRoundTripsEveryField) {
  const auto s = make_side(side("tiny-hybrid", "tiny-dflash"));
  const LayoutDescriptor back = descriptor_from_json(to_json(s.descriptor));
  EXPECT_EQ(back, s.descriptor);
  EXPECT_EQ(back.version, kDescriptorVersion);
  EXPECT_EQ(back.model_id.size(), 16u);
  bool recurrent = false;
  bool draft_group = false;
  for (const auto& l : back.layers) recurrent |= l.recurrent && !l.state.empty();
  for (const auto& g : back.groups) draft_group |= g.draft;
  EXPECT_TRUE(recurrent);
  EXPECT_TRUE(draft_group);
}

// A peer's state shapes and splits become run offsets: ones that do not add up are refused.
TEST(LayoutDescriptor, StateShapesThatDoNotAddUpAreRefused) {
  const auto s = make_side({});
  const nlohmann::json j = to_json(s.descriptor);
  ASSERT_TRUE(s.descriptor.layers.at(0).recurrent);
  nlohmann::json split = j;
  split["layers"][0]["state"][0]["segments"][0]["size"] = 1;
  EXPECT_THAT([&] { descriptor_from_json(split); },
              ::testing::ThrowsMessage<Error>(HasSubstr("'conv' has an inconsistent shape")));
  nlohmann::json shape = j;
  shape["layers"][0]["state"][1]["shape"][1] = 1 << 20;  // not the split dimension
  EXPECT_THAT([&] { descriptor_from_json(shape); },
              ::testing::ThrowsMessage<Error>(HasSubstr("do not add up to its")));
}

TEST(LayoutDescriptor, MalformedJsonNamesTheKey) {
  const auto s = make_side({});
  nlohmann::json j = to_json(s.descriptor);
  j["layers"][0].erase("k_token_bytes");
  EXPECT_THAT([&] { descriptor_from_json(j); },
              ::testing::ThrowsMessage<Error>(HasSubstr("has no key 'k_token_bytes'")));
  j = to_json(s.descriptor);
  j["version"] = kDescriptorVersion + 1;
  EXPECT_THAT([&] { descriptor_from_json(j); },
              ::testing::ThrowsMessage<Error>(HasSubstr("version")));
  j = to_json(s.descriptor);
  j["layers"][0]["tensor"] = 99;
  EXPECT_THAT([&] { descriptor_from_json(j); },
              ::testing::ThrowsMessage<Error>(HasSubstr("inconsistent geometry")));
  j = to_json(s.descriptor);
  j["layers"][0]["kv_layout"] = "hnd";
  EXPECT_THAT([&] { descriptor_from_json(j); },
              ::testing::ThrowsMessage<Error>(HasSubstr("kv_layout 'hnd'; it is NHD or HND")));
}

// nlohmann's own conversions would take 4294967297 as tensor 1, 1.5 as head size 1, true as 1 and
// 1e30 as undefined behaviour: a peer's numbers are read exactly or refused.
TEST(LayoutDescriptor, NumbersAreExactIntegersInRange) {
  const auto s = make_side({});
  const nlohmann::json j = to_json(s.descriptor);
  const auto refused = [&](const nlohmann::json& m, const std::string& field) {
    EXPECT_THAT([&] { descriptor_from_json(m); },
                ::testing::ThrowsMessage<Error>(HasSubstr(field + " has the wrong type or range")))
        << m.dump().substr(0, 200);
  };
  for (const nlohmann::json& bad : {nlohmann::json(1.5), nlohmann::json(1e30), nlohmann::json(true),
                                    nlohmann::json("1"), nlohmann::json(18446744073709551615ULL)}) {
    for (const char* key : {"tensor", "head_size", "offset"}) {
      nlohmann::json m = j;
      m["layers"][0][key] = bad;
      refused(m, std::string(".") + key);
    }
    nlohmann::json m = j;
    m["tensor_bytes"][0] = bad;
    refused(m, "tensor_bytes");
  }
  for (const char* key : {"tensor", "head_size"}) {  // 32-bit fields: 2^32 + 1 is not 1
    nlohmann::json m = j;
    m["layers"][0][key] = 4294967297LL;
    refused(m, std::string(".") + key);
  }
}

// Found by DescriptorFuzz under the sanitizers: a peer's numbers that were in range for their
// type but whose sums and products overflowed (an offset of 2^63 - 1 plus a page, a block id of
// 2^62 times a stride, a segment list adding past 2^63, a window of 0).
TEST(LayoutDescriptor, NumbersThatWouldOverflowThePlanAreRefused) {
  const auto s = make_side(side("tiny-swa"));
  const nlohmann::json j = to_json(s.descriptor);
  for (const auto& [key, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"offset", std::numeric_limits<std::int64_t>::max()},
           {"kernel_page_stride", std::int64_t{1} << 51},
           {"kernel_pages_per_block", std::int64_t{1} << 40},
           {"kernel_tokens", std::int64_t{1} << 40},
           {"num_kv_heads", 0}}) {
    nlohmann::json m = j;
    m["layers"][0][key] = value;
    EXPECT_THAT([&] { descriptor_from_json(m); },
                ::testing::ThrowsMessage<Error>(HasSubstr("inconsistent geometry")))
        << key;
  }
  // HND strides span kernel_tokens head pieces: a K half past a tensor's size is refused.
  for (std::size_t i = 0; i < j["layers"].size(); ++i) {
    if (j["layers"][i]["recurrent"].get<bool>()) continue;
    nlohmann::json m = j;
    m["layers"][i]["kv_layout"] = "HND";
    m["layers"][i]["kernel_tokens"] = std::int64_t{1} << 31;
    m["layers"][i]["block_tokens"] = std::int64_t{1} << 31;
    m["layers"][i]["kernel_pages_per_block"] = 1;
    m["layers"][i]["k_token_bytes"] = std::int64_t{1} << 40;
    EXPECT_THAT([&] { descriptor_from_json(m); },
                ::testing::ThrowsMessage<Error>(HasSubstr("inconsistent geometry")));
    break;
  }
  nlohmann::json big = j;
  big["tensor_bytes"][0] = std::numeric_limits<std::int64_t>::max();
  EXPECT_THAT([&] { descriptor_from_json(big); },
              ::testing::ThrowsMessage<Error>(HasSubstr("(0 to 2^50)")));
  // A block id the peer sends, far past its pool: refused, not wrapped into range.
  RequestBlocks blocks = testing::make_blocks(s, 64, 1);
  RequestBlocks far = blocks;
  far.groups.at(0).back() = std::int64_t{1} << 62;
  EXPECT_THAT(
      [&] {
        plan_pull(s.descriptor, s.descriptor, far, blocks, {64, 0});
      },
      ::testing::ThrowsMessage<Error>(HasSubstr("overflows a 64-bit integer")));
  // A window (or chunk) of no tokens: the plan would divide by it.
  for (std::size_t i = 0; i < j["layers"].size(); ++i) {
    if (j["layers"][i]["window"].is_null()) continue;
    nlohmann::json m = j;
    m["layers"][i]["window"] = 0;
    EXPECT_THAT([&] { descriptor_from_json(m); },
                ::testing::ThrowsMessage<Error>(HasSubstr("inconsistent geometry")));
    return;
  }
  ADD_FAILURE() << "tiny-swa has no sliding layer to test a window of 0 on";
}

TEST(Reconcile, AcceptsOtherBlockSizesPoliciesAndTpAndSaysSo) {
  SideOptions p = side("tiny-swa", "tiny-eagle");
  SideOptions d = p;
  d.policy = plan::Policy::kVllm;
  d.block_size = 32;
  d.tp = 2;
  d.tp_rank = 1;
  const Reconciliation r = reconcile(make_side(p).descriptor, make_side(d).descriptor);
  std::string all;
  for (const auto& line : r.differences) all += line + "\n";
  EXPECT_THAT(all, HasSubstr("TP 1 (prefill) vs TP 2 (decode)"));
  EXPECT_THAT(all, HasSubstr("policy mixkv (prefill) vs vllm (decode)"));
  EXPECT_THAT(all, HasSubstr("moved token run by token run"));
}

TEST(Reconcile, RefusesAnotherModelNamingBothSides) {
  const auto a = make_side(side("tiny-swa"));
  const auto b = make_side(side("tiny-hybrid"));
  const std::string m = refusal(a.descriptor, b.descriptor);
  EXPECT_THAT(m, HasSubstr("model_id differs"));
  EXPECT_THAT(m, HasSubstr("(tiny-swa)"));
  EXPECT_THAT(m, HasSubstr("(tiny-hybrid)"));
}

TEST(Reconcile, RefusesAnotherDrafter) {
  const auto a = make_side(side("tiny-swa", "tiny-eagle"));
  const auto b = make_side(side("tiny-swa", "tiny-dflash"));
  EXPECT_THAT(refusal(a.descriptor, b.descriptor), HasSubstr("model_id differs"));
}

TEST(Reconcile, RefusesAnotherDtypeNamingLayerAndValues) {
  const auto a = make_side(side("tiny-swa"));
  SideOptions fp8 = side("tiny-swa");
  fp8.kv_dtype = DType::kBfloat16;
  const auto b = make_side(fp8);
  const std::string m = refusal(a.descriptor, b.descriptor);
  EXPECT_THAT(
      m, HasSubstr("layer layers.0 dtype differs: prefill side float32, decode side bfloat16"));
}

TEST(Reconcile, RefusesAnotherHeadSize) {
  const auto a = make_side(side("tiny-swa"));
  LayoutDescriptor b = a.descriptor;
  b.layers[1].head_size *= 2;
  EXPECT_THAT(refusal(a.descriptor, b),
              HasSubstr("layer layers.1 head_size differs: prefill side 16, decode side 32"));
}

TEST(Reconcile, SlicesStatesAcrossTpButRefusesAStateWithoutAKnownSplit) {
  const auto a = make_side(side("tiny-hybrid"));
  SideOptions tp2 = side("tiny-hybrid");
  tp2.tp = 2;
  const auto b = make_side(tp2);
  EXPECT_THAT(reconcile(a.descriptor, b.descriptor).differences,
              ::testing::Contains(HasSubstr("recurrent heads sliced")));
  LayoutDescriptor unknown = b.descriptor;
  unknown.layers.at(0).state.at(0).split_dim = -1;
  unknown.layers.at(0).state.at(0).segments.clear();
  EXPECT_THAT(refusal(a.descriptor, unknown),
              HasSubstr("tp_size differs: prefill side 1, decode side 2 (layer layers.0 state "
                        "tensor 'conv' has no known TP split"));
  LayoutDescriptor other = b.descriptor;  // the same channels, split as one run of heads
  auto& conv = other.layers.at(0).state.at(0);
  conv.segments = {{conv.shape.at(1), false}};
  EXPECT_THAT(refusal(a.descriptor, other),
              HasSubstr("layer layers.0 state tensor 'conv' TP split differs"));
}

// Every recurrent kind's state tensors have a known TP split, which rebuilds the whole model's
// shapes from one rank's: Mamba1 (Jamba), KDA (Kimi Linear), lightning (MiniMax-M1), GDN
// (Qwen3-Next), Mamba2 with split groups (Nemotron-H). Described and planned only: no pages.
TEST(Reconcile, EveryRecurrentKindSlicesAcrossTp) {
  const std::string minimax =
      std::string(MIXKV_SOURCE_DIR) + "/tests/model/fixtures/minimax-m1-80k.json";
  for (const std::string& name :
       {std::string("jamba-v0.1"), std::string("kimi-linear-48b"), minimax,
        std::string("qwen3-next-80b-a3b"), std::string("nemotron-h-8b")}) {
    SCOPED_TRACE(name);
    const auto describe = [&](int tp, int rank, const model::ModelDesc* unsharded) {
      model::DescribeOptions o;
      o.tp = tp;
      const model::ModelDesc desc = model::describe_refs(name, std::nullopt, o);
      plan::PlanOptions p;
      p.memory_bytes = std::int64_t{64} << 30;
      p.max_model_len = 4096;
      p.request_len = 1024;
      const plan::CachePlan plan = plan::make_plan(desc, p);
      const layout::Geometry geo =
          layout::make_geometry(desc, plan, attn::build_attention_groups(desc, plan));
      DescriptorOptions d;
      d.tp_rank = rank;
      d.unsharded = unsharded;
      return std::pair(desc, make_descriptor(desc, plan, geo, d));
    };
    const auto [whole, one] = describe(1, 0, nullptr);
    const auto [sharded, two] = describe(2, 1, &whole);
    int states = 0;
    for (std::size_t l = 0; l < two.layers.size(); ++l) {
      for (std::size_t t = 0; t < two.layers[l].state.size(); ++t) {
        const StateTensorLayout& s = two.layers[l].state[t];
        EXPECT_GE(s.split_dim, 0) << two.layers[l].name << " " << s.name;
        EXPECT_EQ(whole_shape(s, 2), one.layers[l].state.at(t).shape)
            << two.layers[l].name << " " << s.name;
        ++states;
      }
    }
    EXPECT_GT(states, 0);
    EXPECT_NO_THROW(reconcile(one, two));
    EXPECT_NO_THROW(reconcile(two, one));
  }
}

TEST(Reconcile, RefusesAnotherStateLayout) {
  const auto a = make_side(side("tiny-hybrid"));
  LayoutDescriptor b = a.descriptor;
  for (auto& l : b.layers) {
    if (l.recurrent) {
      l.state.at(0).shape.at(0) += 1;
      break;
    }
  }
  EXPECT_THAT(refusal(a.descriptor, b), HasSubstr("layer layers.0 state tensor 'conv' differs"));
}

}  // namespace
}  // namespace mixkv::transfer
