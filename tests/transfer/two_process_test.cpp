// Prefill and decode in two processes (this test program re-executed as the other side, see
// TransferChild.Run): a byte-for-byte pull over TCP, and each side killed mid-transfer.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "child_process.hpp"
#include "mixkv/transfer/ucx_agent.hpp"
#include "transfer/transfer_test_support.hpp"
#include "two_hosts.hpp"

namespace mixkv::transfer {
namespace {

using testing::make_blocks;
using testing::make_side;
using testing::SideOptions;
using namespace std::chrono_literals;

constexpr std::uint64_t kProcessSeed = 99;
constexpr std::int64_t kTokens = 1000;
constexpr std::int64_t kRequest = 1;

SideOptions prefill_options() {
  SideOptions o;
  o.model = "tiny-hybrid";
  o.draft = "tiny-dflash";
  o.memory = std::int64_t{32} << 20;
  return o;
}

SideOptions decode_options() {
  SideOptions o = prefill_options();
  o.block_size = 64;
  o.policy = plan::Policy::kVllm;
  return o;
}

AgentOptions tcp() {
  AgentOptions a;
  a.transports = "tcp";
  a.timeout = 10s;
  a.lease = 10s;
  return a;
}

void write_all(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t k = ::write(fd, text.data() + done, text.size() - done);
    if (k <= 0) return;
    done += static_cast<std::size_t>(k);
  }
}

// This test program again as one of TransferChild.Run's roles.
struct Child : mixkv::testing::ChildProcess {
  Child() : ChildProcess("MIXKV_TRANSFER_CHILD", "TransferChild.Run") {}
};

// The other process. Roles: "prefill@HOST" (listens on HOST, offers the request, reports its
// port and then its release), "decode@HOST:PORT" (pulls, reports the result, the mismatched
// bytes and whether exactly the request's bytes were written), "decode-die@HOST:PORT" (kills
// itself once the offer arrived).
TEST(TransferChild, Run) {
  const char* env = std::getenv("MIXKV_TRANSFER_CHILD");
  if (!env) GTEST_SKIP() << "runs only as the other process of the TwoProcess tests";
  std::string spec = env;
  const int fd = std::stoi(spec.substr(spec.rfind(':') + 1));
  spec = spec.substr(0, spec.rfind(':'));
  const std::string role = spec.substr(0, spec.find('@'));
  const std::string where = spec.substr(spec.find('@') + 1);
  if (role == "prefill") {
    auto p = make_side(prefill_options());
    const RequestBlocks pb = make_blocks(p, kTokens, 1);
    testing::fill(p, pb, kTokens, kProcessSeed);
    PrefillAgent agent(p.descriptor, p.tensors(), tcp(), where);
    agent.offer(kRequest, pb, kTokens);
    write_all(fd, std::to_string(agent.port()) + "\n");
    const auto until = std::chrono::steady_clock::now() + 20s;
    while (std::chrono::steady_clock::now() < until) {
      const auto r = agent.take_released();
      if (!r.empty()) {
        write_all(fd, std::string(to_string(r[0].reason)) + "\n");
        // A moment for the last acknowledgement to leave UCX's queues before the process ends.
        std::this_thread::sleep_for(300ms);
        std::_Exit(0);
      }
      std::this_thread::sleep_for(1ms);
    }
    std::_Exit(3);
  }
  const std::string host = where.substr(0, where.find(':'));
  const int port = std::stoi(where.substr(where.find(':') + 1));
  auto d = make_side(decode_options());
  AgentOptions o = tcp();
  if (role == "decode-die") o.after_offer = [] { ::kill(::getpid(), SIGKILL); };
  DecodeAgent agent(d.descriptor, d.tensors(), o);
  agent.connect(host, static_cast<std::uint16_t>(port));
  const RequestBlocks db = make_blocks(d, kTokens, 2);
  const PullResult r = agent.pull(kRequest, db, {kTokens, 0});
  const bool exact = testing::touched(d) == testing::expected_bytes(d, db, 0, kTokens);
  write_all(fd, fmt::format("{} {} {}\n", to_string(r.reason),
                            testing::mismatches(d, db, 0, kTokens, kProcessSeed),
                            exact ? "exact" : "other"));
  std::_Exit(r.ok() ? 0 : 4);
}

TEST(TwoProcess, DecodePullsFromAPrefillProcessByteForByte) {
  Child child;
  child.spawn("prefill@127.0.0.1");
  const std::string port = child.line(20s);
  ASSERT_FALSE(port.empty()) << "the prefill process did not start";
  auto d = make_side(decode_options());
  const RequestBlocks db = make_blocks(d, kTokens, 2);
  DecodeAgent agent(d.descriptor, d.tensors(), tcp());
  agent.connect("127.0.0.1", static_cast<std::uint16_t>(std::stoi(port)));
  const PullResult r = agent.pull(kRequest, db, {kTokens, 0});
  ASSERT_TRUE(r.ok()) << to_string(r.reason) << ": " << r.message;
  EXPECT_EQ(testing::mismatches(d, db, 0, kTokens, kProcessSeed), 0);
  EXPECT_EQ(testing::touched(d), testing::expected_bytes(d, db, 0, kTokens));
  EXPECT_EQ(child.line(10s), "none");  // released as completed
  EXPECT_EQ(child.wait_exit(), 0);
}

TEST(TwoProcess, PrefillKilledMidTransferFailsCleanly) {
  Child child;
  child.spawn("prefill@127.0.0.1");
  const std::string port = child.line(20s);
  ASSERT_FALSE(port.empty()) << "the prefill process did not start";
  auto d = make_side(decode_options());
  AgentOptions o = tcp();
  o.after_offer = [&] {
    ::kill(child.pid, SIGKILL);
    child.wait_exit();
  };
  DecodeAgent agent(d.descriptor, d.tensors(), o);
  agent.connect("127.0.0.1", static_cast<std::uint16_t>(std::stoi(port)));
  const auto t0 = std::chrono::steady_clock::now();
  const PullResult r = agent.pull(kRequest, make_blocks(d, kTokens, 2), {kTokens, 0});
  EXPECT_EQ(r.reason, FailureReason::kPeerFailed) << r.message;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);  // found by UCX, not the timeout
  EXPECT_EQ(agent.num_peers(), 0u);                      // the dead peer is dropped
}

TEST(TwoProcess, DecodeKilledMidTransferReleasesThePrefillBlocks) {
  auto p = make_side(prefill_options());
  const RequestBlocks pb = make_blocks(p, kTokens, 1);
  testing::fill(p, pb, kTokens, kProcessSeed);
  PrefillAgent agent(p.descriptor, p.tensors(), tcp());  // lease 10 s
  agent.offer(kRequest, pb, kTokens);
  Child child;
  child.spawn("decode-die@127.0.0.1:" + std::to_string(agent.port()));
  EXPECT_EQ(child.wait_exit(), 128 + SIGKILL);
  const auto until = std::chrono::steady_clock::now() + 8s;
  std::vector<Release> released;
  while (released.empty() && std::chrono::steady_clock::now() < until) {
    released = agent.take_released();
    std::this_thread::sleep_for(1ms);
  }
  // Freed because UCX reported the reader dead, well before the 10 s lease.
  EXPECT_EQ(released, (std::vector<Release>{{kRequest, FailureReason::kPeerFailed}}));
  EXPECT_EQ(agent.num_pinned(), 0u);
}

// Two hosts: two network namespaces joined by a veth pair, made here and removed after; the
// prefill process in one, the decode process in the other, UCX over TCP between them.
class TwoHosts : public mixkv::testing::TwoHostsTest {
 protected:
  TwoHosts() : TwoHostsTest("t", "10.177.0") {}
};

TEST_F(TwoHosts, DecodeHostPullsFromPrefillHostOverTcp) {
  Child prefill;
  prefill.spawn("prefill@" + prefill_ip_, prefill_ns_);
  const std::string port = prefill.line(20s);
  ASSERT_FALSE(port.empty()) << "the prefill process did not start";
  Child decode;
  decode.spawn(std::string("decode@") + prefill_ip_ + ":" + port, decode_ns_);
  EXPECT_EQ(decode.line(20s), "none 0 exact");
  EXPECT_EQ(decode.wait_exit(), 0);
  EXPECT_EQ(prefill.line(10s), "none");
  EXPECT_EQ(prefill.wait_exit(), 0);
}

}  // namespace
}  // namespace mixkv::transfer
