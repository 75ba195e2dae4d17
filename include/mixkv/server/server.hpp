// `mixkv serve`: an OpenAI-compatible HTTP server over the one scheduler (mixkv::sched). HTTP
// threads parse and check requests (api.hpp) and stream results; one engine thread owns the
// scheduler, the model and the drafter, takes new requests and cancellations at step
// boundaries, and steps. docs/server.md: endpoints, fields, errors, metrics, threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mixkv/runner/model_runner.hpp"
#include "mixkv/spec/drafter.hpp"
#include "mixkv/tokenizer/chat_template.hpp"
#include "mixkv/tokenizer/tokenizer.hpp"
#include "mixkv/transfer/ucx_agent.hpp"

namespace mixkv::server {

using TokenId = tokenizer::TokenId;

// Prefill/decode disaggregation (`--kv-role`, docs/transfer.md "Serving path").
enum class KvRole { kNone, kPrefill, kDecode };

struct KvOptions {
  KvRole role = KvRole::kNone;
  // Prefill: where the UCX agent's bootstrap socket listens (IPv4; port 0: any free one).
  std::string host = "127.0.0.1";
  int port = 0;
  // Decode: HOST:PORT of the prefill server's agent (its --kv-port).
  std::string peer;
  // Decode: a failed remote prefill or pull fails the request (503) instead of recomputing.
  bool fail_on_load_failure = false;
  // Lease, timeout, checksums, transports, peer failure detection; tests plant faults here.
  transfer::AgentOptions agent = {};
};

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                  // 0: any free port (port() tells which)
  std::int64_t max_num_seqs = 16;   // requests running at once
  std::int64_t max_queue = 64;      // requests waiting beyond which a new one gets 503
  std::int64_t prefill_chunk = 32;  // prompt tokens one request computes per step
  bool prefix_caching = true;
  std::string api_key;                   // empty: no key asked
  std::string served_model_name;         // what /v1/models lists and requests may name
  double shutdown_timeout = 30;          // seconds shutdown() lets running requests finish
  std::size_t max_body_bytes = 1 << 20;  // larger bodies get 413
  // HTTP worker threads, one per open connection (cpp-httplib's model); 0: max_num_seqs +
  // max_queue + 8, so every request the scheduler may hold has a connection and a few more can
  // be told 503.
  int http_threads = 0;
  KvOptions kv = {};
};

// What is served. Everything outlives the Server.
struct ServedModel {
  runner::ModelRunner* runner = nullptr;
  spec::Drafter* drafter = nullptr;  // null: plain decoding
  int num_spec_tokens = 0;
  const tokenizer::Tokenizer* tokenizer = nullptr;         // null: token-id prompts only
  const tokenizer::ChatTemplate* chat_template = nullptr;  // null: no chat completions
  // Tokens that end a request unless it asks for ignore_eos (the vocabulary's EOS and
  // end-of-turn ids); the scheduler stops there, speculative or not.
  std::vector<TokenId> stop_tokens;
};

class Server {
 public:
  explicit Server(ServeOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and starts serving: /health answers 503 and the model routes 503 until attach().
  // Throws Error when the address cannot be bound.
  void start();
  int port() const;
  // --kv-role prefill: the port the agent's bootstrap socket listens on (after attach()).
  int kv_port() const;
  // Starts the engine thread over `model`; /health turns 200.
  void attach(const ServedModel& model);
  // Drains: new requests get 503, running ones get up to shutdown_timeout to finish, then the
  // rest are cancelled (their streams end with an error event) and the server stops. Returns
  // whether everything finished in time. Idempotent.
  bool shutdown();
  // The /metrics text (tests read it without HTTP too).
  std::string metrics_text() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace mixkv::server
