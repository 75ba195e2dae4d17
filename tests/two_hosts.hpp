// Two hosts on one machine for the tests that move KV between processes over TCP: two network
// namespaces joined by a veth pair, made in SetUp and removed in TearDown. Where namespaces
// cannot be made (not root, no iproute2) the test is skipped with that reason, never passed.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <utility>

namespace mixkv::testing {

class TwoHostsTest : public ::testing::Test {
 protected:
  // `tag` keeps the names of two test programs running at once apart; `subnet` is the first
  // three octets of the pair's /24 (prefill host .1, decode host .2).
  TwoHostsTest(std::string tag, std::string subnet)
      : tag_(std::move(tag)), prefill_ip_(subnet + ".1"), decode_ip_(subnet + ".2") {}

  void SetUp() override {
    const std::string id = std::to_string(::getpid());
    prefill_ns_ = "mixkv-" + tag_ + "p" + id;
    decode_ns_ = "mixkv-" + tag_ + "d" + id;
    if (std::system(("ip netns add " + prefill_ns_ + " >/dev/null 2>&1").c_str()) != 0) {
      GTEST_SKIP() << "cannot create network namespaces here (`ip netns add` needs root and the "
                      "iproute2 package): the two-host test is skipped";
    }
    made_ = true;
    const std::string vp = "mk" + tag_ + "p" + id, vd = "mk" + tag_ + "d" + id;
    const std::string script =
        "ip netns add " + decode_ns_ + " && ip link add " + vp + " type veth peer name " + vd +
        " && ip link set " + vp + " netns " + prefill_ns_ + " && ip link set " + vd + " netns " +
        decode_ns_ + " && ip -n " + prefill_ns_ + " addr add " + prefill_ip_ + "/24 dev " + vp +
        " && ip -n " + decode_ns_ + " addr add " + decode_ip_ + "/24 dev " + vd + " && ip -n " +
        prefill_ns_ + " link set " + vp + " up && ip -n " + decode_ns_ + " link set " + vd +
        " up && ip -n " + prefill_ns_ + " link set lo up && ip -n " + decode_ns_ +
        " link set lo up";
    ASSERT_EQ(std::system((script + " >/dev/null 2>&1").c_str()), 0) << script;
  }

  void TearDown() override {
    if (!made_) return;
    // Removing a namespace removes its end of the veth pair, and with it the other end.
    (void)std::system(("ip netns del " + prefill_ns_ + " >/dev/null 2>&1").c_str());
    (void)std::system(("ip netns del " + decode_ns_ + " >/dev/null 2>&1").c_str());
  }

  const std::string tag_, prefill_ip_, decode_ip_;
  std::string prefill_ns_, decode_ns_;
  bool made_ = false;
};

}  // namespace mixkv::testing
