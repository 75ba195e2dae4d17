// The UCX agents of prefill/decode disaggregation. One UCP context and worker per instance; the
// KV tensors registered once (ucp_mem_map) and their rkeys sent at the handshake; the decode side
// pulls (ucp_get_nbx into its own pages, run by run of the pull plan), verifies the per-page
// checksums, and tells the prefill side by an active message, which frees the request's blocks
// only then. A lease (renewed by heartbeats) frees them when the decode side goes silent; UCX's
// peer error handling reports a dead peer on either side. docs/transfer.md has the protocol.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mixkv/transfer/layout_descriptor.hpp"
#include "mixkv/transfer/transfer_plan.hpp"

namespace mixkv::transfer {

enum class FailureReason {
  kNone,
  kRefused,           // the handshake's reconcile() refused the pair, or a request was bad
  kPeerFailed,        // UCX reported the peer gone (or the connection broken)
  kTimeout,           // no answer / no completion before the deadline
  kChecksumMismatch,  // a page arrived other than it was sent
  kLeaseExpired,      // the prefill side freed the blocks before the reader finished
  kUnknownRequest,    // the prefill side holds no such request
};
std::string_view to_string(FailureReason reason);

struct AgentOptions {
  // UCX transports (UCX_TLS), e.g. "tcp" or "posix,self"; empty: UCX's choice (or UCX_TLS).
  std::string transports;
  // Prefill: blocks of an offered request are freed this long after its last sign of life.
  std::chrono::milliseconds lease{5000};
  // Decode: a heartbeat to every prefill peer this often while a pull runs.
  std::chrono::milliseconds heartbeat{100};
  // Decode: the whole pull (offer, gets, acknowledgement) must finish within this.
  std::chrono::milliseconds timeout{10000};
  bool checksums = true;
  // UCP_ERR_HANDLING_MODE_PEER (with UCX's keepalive) on every endpoint, so a dead peer is
  // reported at once. UCX 1.13's shared-memory transports have no peer failure handler: with it
  // on, UCX moves even same-host transfers over TCP loopback. Off, shared memory is used and a
  // dead peer is found by the timeout and the lease only.
  bool peer_failure_detection = true;
  // Prefill: sent to every decode side at the handshake, unread by the agent (the server puts
  // the address of its control channel there); DecodeAgent::control() returns it.
  std::string control;
  // Decode, for tests: called once the offers arrived (the prefill side's pages hashed), before
  // the first get (a test changes a prefill page there, as a bad link would change what lands).
  std::function<void()> after_offer;
};

// A request whose blocks the prefill side may free now, and why (kNone: the readers completed).
struct Release {
  std::int64_t request = 0;
  FailureReason reason = FailureReason::kNone;
  bool operator==(const Release&) const = default;
};

class PrefillAgent {
 public:
  // Registers `tensors` (indexed like the descriptor's tensor_bytes; they must outlive the
  // agent) and listens for decode sides on host:port (port 0: any free port).
  PrefillAgent(LayoutDescriptor layout, TensorSpans tensors, AgentOptions options = {},
               const std::string& host = "127.0.0.1", std::uint16_t port = 0);
  ~PrefillAgent();
  PrefillAgent(const PrefillAgent&) = delete;
  PrefillAgent& operator=(const PrefillAgent&) = delete;

  std::uint16_t port() const;
  // The request's KV is ready: `readers` decode ranks will pull it. Its blocks stay pinned until
  // every reader completed or failed, or its lease expired; then take_released() returns it.
  // With checksums, a thread of the agent hashes the request's pages from here on, so that a
  // fetch finds them hashed; a fetch that comes sooner hashes the pages still missing itself.
  void offer(std::int64_t request, RequestBlocks blocks, std::int64_t num_tokens, int readers = 1);
  // Whether the request is offered and its pages hashed (at once without checksums).
  bool offer_ready(std::int64_t request) const;
  std::vector<Release> take_released();
  std::size_t num_pinned() const;
  std::size_t num_peers() const;  // decode sides connected and alive

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct PullResult {
  FailureReason reason = FailureReason::kNone;
  std::string message;  // why it failed, naming the layer/page or peer
  std::int64_t bytes = 0;
  std::int64_t runs = 0;  // of the pull plans
  std::int64_t gets = 0;  // ucp_get_nbx calls: the runs, those that continue one another joined
  double seconds = 0;     // from the first fetch to the acknowledgement
  double checksum_seconds = 0;  // of that, verifying checksums (between the gets' progress)
  double offer_seconds = 0;     // of that, from the fetch to the offers
  double get_seconds = 0;       // of that, the gets (with the verification between them)
  bool ok() const { return reason == FailureReason::kNone; }
};

class DecodeAgent {
 public:
  DecodeAgent(LayoutDescriptor layout, TensorSpans tensors, AgentOptions options = {});
  ~DecodeAgent();
  DecodeAgent(const DecodeAgent&) = delete;
  DecodeAgent& operator=(const DecodeAgent&) = delete;

  // Handshake with one prefill rank (call once per prefill rank). Throws Error (kInvalidInput)
  // with reconcile()'s message when either side refuses, or when the peer cannot be reached.
  void connect(const std::string& host, std::uint16_t port);
  std::size_t num_peers() const;
  // The `AgentOptions::control` that the i-th prefill rank connect()ed to sent.
  const std::string& control(std::size_t i) const;
  // Pulls request `request` from every connected prefill rank into `blocks` (this side's block
  // table). On failure the blocks' contents are undefined and no get is left in flight.
  PullResult pull(std::int64_t request, const RequestBlocks& blocks, const PullSpec& spec);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mixkv::transfer
