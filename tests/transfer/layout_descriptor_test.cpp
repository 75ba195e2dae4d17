// The layout descriptor: JSON round trip, what reconcile() accepts and what it refuses.
#include "mixkv/transfer/layout_descriptor.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "mixkv/core/error.hpp"
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
  SideOptions o;
  o.draft = "tiny-dflash";
  const auto s = make_side(o);
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

TEST(Reconcile, RefusesTpChangeWithRecurrentLayers) {
  const auto a = make_side(side("tiny-hybrid"));
  SideOptions tp2 = side("tiny-hybrid");
  tp2.tp = 2;
  const auto b = make_side(tp2);
  EXPECT_THAT(refusal(a.descriptor, b.descriptor),
              HasSubstr("tp_size differs: prefill side 1, decode side 2 (recurrent states"));
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
  EXPECT_THAT(refusal(a.descriptor, b), HasSubstr("state tensors differs"));
}

}  // namespace
}  // namespace mixkv::transfer
