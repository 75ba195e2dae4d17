// Prefill/decode disaggregation through the servers (`mixkv serve --kv-role`), in process: a
// prefill Server and a decode Server, each over its own runner, UCX between their agents. The
// decode server's greedy tokens after a remote prefill equal `generate`'s on one instance, for
// each tiny model (and SmolLM2 where `make deps` fetched it) with its drafter, with equal and
// different block sizes, policies and page orders (NHD, HND); faults (a planted corrupt page, a mismatched model, a slow
// prefill server, a prefill process killed mid-transfer, a decode process killed mid-transfer)
// never serve a wrong token and leave both pools idle.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "child_process.hpp"
#include "cli/runner_setup.hpp"
#include "mixkv/core/error.hpp"
#include "mixkv/engine/generator.hpp"
#include "mixkv/server/server.hpp"
#include "mixkv/tokenizer/byte_tokenizer.hpp"
#include "mixkv/weights/model_files.hpp"
#include "two_hosts.hpp"

namespace mixkv::server {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using TokenList = std::vector<TokenId>;

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
constexpr auto kTimeout = 60s;  // a remote prefill under ASan is ten times slower
constexpr int kSlowPrompt = 300;
#else
constexpr bool kSanitized = false;
constexpr auto kTimeout = 5s;
constexpr int kSlowPrompt = 1500;  // prefilled one token per step: far past the 20 ms timeout
#endif

// One instance's model: runner, drafter, vocabulary.
struct Instance {
  Instance(const std::string& model, const std::string& draft, std::int64_t block_size,
           plan::Policy policy, std::int64_t memory = 16ll << 20,
           attn::KvLayout kv_layout = attn::KvLayout::kNHD)
      : setup(cli::prepare_runner(model, draft, draft.empty() ? 0 : 3, memory)), draft_name(draft) {
    setup.options.block_size = block_size;
    setup.options.policy = policy;
    setup.options.kv_layout = kv_layout;
    runner = std::make_unique<runner::ModelRunner>(setup.make_runner());
    drafter = cli::make_drafter(draft, *runner, 0);
    if (!setup.tokenizer) setup.tokenizer = std::make_unique<tokenizer::ByteTokenizer>();
  }
  ServedModel served() {
    ServedModel m;
    m.runner = runner.get();
    m.drafter = drafter.get();
    m.num_spec_tokens = drafter ? 3 : 0;
    m.tokenizer = setup.tokenizer.get();
    return m;
  }
  // Greedy tokens of each prompt on this instance alone (before it serves).
  std::vector<TokenList> generate(const std::vector<TokenList>& prompts, std::int64_t max_tokens) {
    engine::GenerateOptions go;
    go.max_tokens = max_tokens;
    go.num_spec_tokens = drafter ? 3 : 0;
    const engine::GenerateReport r = engine::generate(*runner, prompts, drafter.get(), go);
    std::vector<TokenList> out;
    for (const auto& q : r.requests) out.emplace_back(q.tokens.begin(), q.tokens.end());
    return out;
  }
  cli::RunnerSetup setup;
  std::string draft_name;
  std::unique_ptr<runner::ModelRunner> runner;
  std::unique_ptr<spec::Drafter> drafter;
};

ServeOptions serve_options(KvRole role, std::string peer = "") {
  ServeOptions o;
  o.port = 0;
  o.served_model_name = "m";
  o.shutdown_timeout = 5;
  o.max_num_seqs = 4;
  o.http_threads = 8;
  o.kv.role = role;
  o.kv.peer = std::move(peer);
  o.kv.agent.transports = "tcp";
  o.kv.agent.timeout = kTimeout;
  o.kv.agent.lease = 3s;
  return o;
}

// Prompts that share a 40-token prefix (the later ones get decode-side prefix hits: only the
// rest is pulled), plus one of a single token (nothing to prefill remotely).
std::vector<TokenList> prompts(TokenId vocab) {
  std::vector<TokenList> p;
  TokenList shared;
  for (int j = 0; j < 40; ++j) shared.push_back(static_cast<TokenId>((7 * j + 3) % vocab));
  for (int i = 0; i < 3; ++i) {
    TokenList t = shared;
    for (int j = 0; j < 9 + 13 * i; ++j)
      t.push_back(static_cast<TokenId>((31 * i + 5 * j) % vocab));
    p.push_back(t);
  }
  p.push_back({static_cast<TokenId>(11 % vocab)});
  return p;
}

// The completion's token ids, or the error body's code (status in *status).
json complete(int port, const TokenList& prompt, std::int64_t max_tokens, int* status = nullptr) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  const auto res =
      c.Post("/v1/completions",
             json{{"prompt", prompt}, {"max_tokens", max_tokens}, {"ignore_eos", true}}.dump(),
             "application/json");
  if (!res) {
    ADD_FAILURE() << "no answer from the decode server";
    return {};
  }
  if (status != nullptr) *status = res->status;
  return json::parse(res->body, nullptr, false);
}

TokenList ids(const json& answer) {
  if (!answer.contains("choices")) {
    ADD_FAILURE() << answer.dump();
    return {};
  }
  return answer["choices"][0]["token_ids"].get<TokenList>();
}

// The value of a metric line (a name with its labels), 0 when absent.
double metric(const Server& s, const std::string& series) {
  const std::string text = s.metrics_text();
  std::size_t at = 0;
  while ((at = text.find(series + " ", at)) != std::string::npos) {
    if (at == 0 || text[at - 1] == '\n') return std::stod(text.substr(at + series.size() + 1));
    at += series.size();
  }
  return 0;
}

// Sum of every kv_cache_usage_perc series, and the prefill side's held requests.
double usage(const Server& s) {
  const std::string text = s.metrics_text();
  const std::string name = "\nmixkv:kv_cache_usage_perc{";
  double sum = 0;
  for (std::size_t at = text.find(name); at != std::string::npos; at = text.find(name, at + 1)) {
    const std::size_t value = text.find("} ", at);
    if (value != std::string::npos) sum += std::stod(text.substr(value + 2));
  }
  return sum + metric(s, "mixkv:kv_transfer_held_requests") +
         metric(s, "mixkv:num_requests_running");
}

bool idle(const Server& s, std::chrono::milliseconds within = 5s) {
  const auto until = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < until) {
    if (usage(s) == 0) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

std::string kv_peer(const Server& prefill) {
  return "127.0.0.1:" + std::to_string(prefill.kv_port());
}

struct PdCase {
  std::string model, draft;
  std::int64_t prefill_block, decode_block;
  plan::Policy prefill_policy, decode_policy;
  std::string name;
  bool hits = true;  // the decode side's prefix cache serves the shared prefix (its blocks)
  attn::KvLayout prefill_layout = attn::KvLayout::kNHD, decode_layout = attn::KvLayout::kNHD;
};

class PdServing : public ::testing::TestWithParam<PdCase> {};

TEST_P(PdServing, DecodeAfterRemotePrefillEqualsOneInstance) {
  const PdCase& c = GetParam();
  if (c.model == "smollm2-135m" && !weights::resolve_gguf(c.model)) {
    GTEST_SKIP() << "SmolLM2 is not in the model cache (`make deps` fetches it)";
  }
  if (c.model == "smollm2-135m" && kSanitized) {
    GTEST_SKIP() << "SmolLM2 takes minutes under the sanitizers; the Release run covers it";
  }
  constexpr std::int64_t kMaxTokens = 8;
  const std::int64_t memory = c.model == "smollm2-135m" ? 48ll << 20 : 16ll << 20;
  Instance prefill_side(c.model, c.draft, c.prefill_block, c.prefill_policy, memory,
                        c.prefill_layout);
  Instance decode_side(c.model, c.draft, c.decode_block, c.decode_policy, memory, c.decode_layout);
  const auto vocab =
      static_cast<TokenId>(std::min<std::int64_t>(decode_side.runner->vocab_size(), 256));
  const std::vector<TokenList> p = prompts(vocab);
  const std::vector<TokenList> expected = decode_side.generate(p, kMaxTokens);

  Server prefill(serve_options(KvRole::kPrefill));
  prefill.start();
  prefill.attach(prefill_side.served());
  Server decode(serve_options(KvRole::kDecode, kv_peer(prefill)));
  decode.start();
  decode.attach(decode_side.served());
  for (std::size_t i = 0; i < p.size(); ++i) {
    EXPECT_EQ(ids(complete(decode.port(), p[i], kMaxTokens)), expected[i]) << "prompt " << i;
  }
  // Every prompt but the one-token one was prefilled remotely and pulled.
  EXPECT_EQ(metric(decode, "mixkv:kv_transfer_latency_seconds_count"), 3);
  EXPECT_GT(metric(decode, "mixkv:kv_transfer_bytes_total"), 0);
  EXPECT_EQ(decode.metrics_text().find("mixkv:kv_transfer_failures_total{"), std::string::npos)
      << decode.metrics_text();
  if (c.hits) {
    EXPECT_GT(metric(decode, "mixkv:prefix_cache_hits_total"), 0);  // the shared prefix
  }
  EXPECT_TRUE(idle(prefill)) << prefill.metrics_text();
  EXPECT_TRUE(idle(decode)) << decode.metrics_text();
}

INSTANTIATE_TEST_SUITE_P(
    Models, PdServing,
    ::testing::Values(PdCase{"tiny-swa", "tiny-eagle", 16, 16, plan::Policy::kMixkv,
                             plan::Policy::kMixkv, "SwaEagleSameLayout"},
                      PdCase{"tiny-swa", "tiny-dflash", 16, 32, plan::Policy::kMixkv,
                             plan::Policy::kVllm, "SwaDflashOtherBlocksAndPolicy", false},
                      PdCase{"tiny-hybrid", "tiny-dflash", 16, 32, plan::Policy::kVllm,
                             plan::Policy::kMixkv, "HybridDflashOtherBlocksAndPolicy"},
                      PdCase{"tiny-mamba", "ngram", 16, 16, plan::Policy::kMixkv,
                             plan::Policy::kMixkv, "MambaNgram", false},
                      PdCase{"smollm2-135m", "ngram", 16, 32, plan::Policy::kMixkv,
                             plan::Policy::kVllm, "SmolLM2NgramOtherBlocksAndPolicy"},
                      // NHD pages to HND pages (each KV head's tokens side by side) and back.
                      PdCase{"tiny-swa", "tiny-eagle", 16, 32, plan::Policy::kMixkv,
                             plan::Policy::kMixkv, "SwaEagleNhdToHnd", true, attn::KvLayout::kNHD,
                             attn::KvLayout::kHND},
                      PdCase{"smollm2-135m", "ngram", 16, 16, plan::Policy::kMixkv,
                             plan::Policy::kMixkv, "SmolLM2NgramHndToNhd", true,
                             attn::KvLayout::kHND, attn::KvLayout::kNHD}),
    [](const auto& info) { return info.param.name; });

// --- faults ---

TokenList long_prompt(int n, int salt = 1) {
  TokenList t;
  for (int j = 0; j < n; ++j) t.push_back(static_cast<TokenId>((13 * j + salt) % 256));
  return t;
}

// A started server over `inst` (for a decode server, attach() runs the handshake).
std::unique_ptr<Server> serve(const ServeOptions& o, Instance& inst) {
  auto s = std::make_unique<Server>(o);
  s->start();
  s->attach(inst.served());
  return s;
}

// tiny-swa on both sides (4 MiB caches), a 70-token prompt and its greedy tokens on one instance.
struct SwaPair {
  Instance ps{"tiny-swa", "", 16, plan::Policy::kMixkv, 4ll << 20};
  Instance ds{"tiny-swa", "", 16, plan::Policy::kMixkv, 4ll << 20};
  TokenList prompt = long_prompt(70);
  TokenList expected = ds.generate({prompt}, 6)[0];
};

// The pull runs off the decode server's engine thread: while request B's pull is held up
// after its offer arrived, request A (one token of prompt: computed locally) keeps streaming
// tokens. Were the pull on the engine thread, A could not step and the hook would wait in vain.
TEST(PdServing, OtherRequestsKeepDecodingWhileAPullIsInFlight) {
  SwaPair m;
  const auto prefill = serve(serve_options(KvRole::kPrefill), m.ps);
  std::atomic<int> a_events{0};
  std::atomic<bool> b_done{false}, progressed{false};
  ServeOptions o = serve_options(KvRole::kDecode, kv_peer(*prefill));
  o.kv.agent.after_offer = [&] {
    const int at = a_events;
    const auto until = std::chrono::steady_clock::now() + kTimeout / 2;
    while (a_events < at + 5 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(1ms);
    }
    progressed = a_events >= at + 5;
  };
  const auto decode = serve(o, m.ds);
  std::thread a([&] {
    httplib::Client c("127.0.0.1", decode->port());
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.set_header("Content-Type", "application/json");
    req.body = json{
        {"prompt", TokenList{11}},
        {"max_tokens", 1000},
        {"stream", true},
        {"ignore_eos",
         true}}.dump();
    // Hangs up once B is answered.
    req.content_receiver = [&](const char*, std::size_t, std::uint64_t, std::uint64_t) {
      ++a_events;
      return !b_done;
    };
    c.send(req);
  });
  const auto until = std::chrono::steady_clock::now() + kTimeout;
  while (a_events == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_GT(a_events, 0) << "request A never streamed";
  EXPECT_EQ(ids(complete(decode->port(), m.prompt, 6)), m.expected);
  b_done = true;
  a.join();
  EXPECT_TRUE(progressed) << "request A got no tokens while B's pull was in flight"
                          << decode->metrics_text();
  EXPECT_EQ(metric(*decode, "mixkv:kv_transfer_latency_seconds_count"), 1);
  EXPECT_TRUE(idle(*prefill)) << prefill->metrics_text();
  EXPECT_TRUE(idle(*decode)) << decode->metrics_text();
}

// A client that leaves while its request's pull is in flight: the request ends once the pull
// is over (its blocks are being written until then), and both pools return to idle.
TEST(PdFaults, AClientLeavingDuringItsPullFreesTheBlocksAfterThePull) {
  SwaPair m;
  const auto prefill = serve(serve_options(KvRole::kPrefill), m.ps);
  std::atomic<bool> in_pull{false}, left{false}, first{true};
  ServeOptions o = serve_options(KvRole::kDecode, kv_peer(*prefill));
  o.kv.agent.after_offer = [&] {
    if (!first.exchange(false)) return;
    in_pull = true;
    const auto until = std::chrono::steady_clock::now() + kTimeout / 2;
    while (!left && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
    std::this_thread::sleep_for(100ms);  // the server notices the hang-up within 20 ms
  };
  const auto decode = serve(o, m.ds);
  httplib::Client c("127.0.0.1", decode->port());
  c.set_read_timeout(60, 0);
  std::thread client([&] {
    c.Post("/v1/completions",
           json{{"prompt", m.prompt}, {"max_tokens", 6}, {"ignore_eos", true}}.dump(),
           "application/json");
  });
  const auto until = std::chrono::steady_clock::now() + kTimeout;
  while (!in_pull && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(in_pull) << "the request's pull never started";
  c.stop();  // hangs up while the pull waits
  client.join();
  left = true;
  EXPECT_TRUE(idle(*decode)) << decode->metrics_text();
  EXPECT_TRUE(idle(*prefill)) << prefill->metrics_text();
  EXPECT_EQ(ids(complete(decode->port(), m.prompt, 6)), m.expected);  // still serving, right
  EXPECT_TRUE(idle(*decode)) << decode->metrics_text();
}

TEST(PdFaults, ACorruptPageIsCaughtByItsChecksumAndRecomputed) {
  SwaPair m;
  const auto prefill = serve(serve_options(KvRole::kPrefill), m.ps);
  ServeOptions o = serve_options(KvRole::kDecode, kv_peer(*prefill));
  // Once the prefill side hashed its pages (the offer came), before the gets: every byte of its
  // first cache tensor changes, so what lands is not what was hashed, as a bad link would make
  // it (the prefill server computes nothing meanwhile; it is changed back after the request).
  std::byte* const first = m.ps.runner->cache_tensor(0).data();
  const std::size_t size = m.ps.runner->cache_tensor(0).size();
  const auto flip = [first, size] {
    for (std::size_t i = 0; i < size; ++i) first[i] ^= std::byte{0x5a};
  };
  o.kv.agent.after_offer = flip;
  const auto decode = serve(o, m.ds);
  EXPECT_EQ(ids(complete(decode->port(), m.prompt, 6)), m.expected);  // recomputed, not the bad KV
  flip();
  EXPECT_EQ(metric(*decode, "mixkv:kv_transfer_failures_total{reason=\"checksum_mismatch\"}"), 1);
  EXPECT_TRUE(idle(*prefill)) << prefill->metrics_text();
  EXPECT_TRUE(idle(*decode)) << decode->metrics_text();
}

TEST(PdFaults, AMismatchedModelIsRefusedAtTheHandshake) {
  Instance ps("tiny-swa", "", 16, plan::Policy::kMixkv, 4ll << 20);
  Instance ds("tiny-hybrid", "", 16, plan::Policy::kMixkv, 4ll << 20);
  const auto prefill = serve(serve_options(KvRole::kPrefill), ps);
  Server decode(serve_options(KvRole::kDecode, kv_peer(*prefill)));
  decode.start();
  try {
    decode.attach(ds.served());
    ADD_FAILURE() << "a decode server of another model joined";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidInput);
    EXPECT_NE(std::string(e.what()).find("KV transfer refused: model_id differs"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(idle(*prefill));
}

// The prefill server computes a long prompt one token per step; the decode side gives up after
// 20 ms and recomputes (or, with --kv-load-failure fail, answers 503). The prefill side's
// blocks go back when its lease ends, nobody having read them.
TEST(PdFaults, ASlowPrefillServerPastTheTimeoutIsRecomputedOrFails) {
  Instance ps("tiny-swa", "", 16, plan::Policy::kMixkv, 4ll << 20);
  Instance ds("tiny-swa", "", 16, plan::Policy::kMixkv, 4ll << 20);
  // Two prompts: the second must not find the first in the prefill side's prefix cache.
  const std::vector<TokenList> prompts = {long_prompt(kSlowPrompt, 1), long_prompt(kSlowPrompt, 2)};
  const std::vector<TokenList> expected = ds.generate(prompts, 4);
  ServeOptions po = serve_options(KvRole::kPrefill);
  po.prefill_chunk = 1;
  po.kv.agent.lease = 300ms;
  const auto prefill = serve(po, ps);
  for (const bool fail : {false, true}) {
    ServeOptions o = serve_options(KvRole::kDecode, kv_peer(*prefill));
    o.kv.agent.timeout = 20ms;
    o.kv.fail_on_load_failure = fail;
    const auto decode = serve(o, ds);
    int status = 0;
    const json answer = complete(decode->port(), prompts[fail], 4, &status);
    if (fail) {
      ASSERT_EQ(status, 503) << answer.dump();
      EXPECT_EQ(answer["error"]["code"], "kv_transfer_failed") << answer.dump();
    } else {
      EXPECT_EQ(status, 200);
      EXPECT_EQ(ids(answer), expected[0]);
    }
    EXPECT_EQ(metric(*decode, "mixkv:kv_transfer_failures_total{reason=\"timeout\"}"), 1);
    EXPECT_TRUE(idle(*decode)) << decode->metrics_text();
    EXPECT_TRUE(idle(*prefill, 10s)) << prefill->metrics_text();
  }
}

// --- processes: a prefill or decode server in another process, killed mid-transfer ---

// The other process: this program again, running one server (MIXKV_PD_CHILD=ROLE[@WHERE]:FD):
// "prefill[@HOST]" serves on HOST (default loopback), writes its HTTP and KV ports to FD and
// serves until killed; "decode-die@PEER" serves as a decode server that kills itself once the
// offer of its first pull arrived; "decode-client@PEER" serves as a decode server, completes
// kClientPrompt itself and writes the token ids and the bytes it pulled to FD.
constexpr int kClientPrompt = 70;

TEST(PdChild, Run) {
  const char* env = std::getenv("MIXKV_PD_CHILD");
  if (env == nullptr) GTEST_SKIP() << "runs only as the other process of the PdProcess tests";
  std::string spec = env;
  const int fd = std::stoi(spec.substr(spec.rfind(':') + 1));
  spec = spec.substr(0, spec.rfind(':'));
  const std::string role = spec.substr(0, spec.find('@'));
  const std::string where =
      spec.find('@') == std::string::npos ? "" : spec.substr(spec.find('@') + 1);
  Instance inst("tiny-swa", "", 16, plan::Policy::kMixkv, 4ll << 20);
  ServeOptions o =
      role == "prefill" ? serve_options(KvRole::kPrefill) : serve_options(KvRole::kDecode, where);
  if (role == "prefill" && !where.empty()) o.host = o.kv.host = where;
  if (role == "decode-die") o.kv.agent.after_offer = [] { ::kill(::getpid(), SIGKILL); };
  Server s(o);
  s.start();
  s.attach(inst.served());
  std::string line = fmt::format("{} {}\n", s.port(), s.kv_port());
  if (role == "decode-client") {
    const TokenList out = ids(complete(s.port(), long_prompt(kClientPrompt), 6));
    line = fmt::format("{} {}\n", fmt::join(out, ","), metric(s, "mixkv:kv_transfer_bytes_total"));
  }
  if (::write(fd, line.data(), line.size()) < 0) std::_Exit(3);
  if (role == "decode-client") {
    s.shutdown();
    std::_Exit(0);
  }
  for (;;) std::this_thread::sleep_for(1s);
}

// This test program again as one of PdChild.Run's roles.
struct Child : mixkv::testing::ChildProcess {
  Child() : ChildProcess("MIXKV_PD_CHILD", "PdChild.Run") {}
  // The HTTP and KV ports a serving child wrote ({0, 0} after the timeout).
  std::pair<int, int> ports() {
    int http = 0, kv = 0;
    if (std::sscanf(line().c_str(), "%d %d", &http, &kv) != 2) return {0, 0};
    return {http, kv};
  }
};

TEST(PdProcess, PrefillKilledMidTransferIsRecomputed) {
  Child child;
  child.spawn("prefill");
  const auto [http, kv] = child.ports();
  ASSERT_GT(kv, 0) << "the prefill process did not start";
  SwaPair m;
  ServeOptions o = serve_options(KvRole::kDecode, "127.0.0.1:" + std::to_string(kv));
  o.kv.agent.after_offer = [&] {
    ::kill(child.pid, SIGKILL);
    child.wait_exit();
  };
  const auto decode = serve(o, m.ds);
  EXPECT_EQ(ids(complete(decode->port(), m.prompt, 6)), m.expected);
  EXPECT_EQ(metric(*decode, "mixkv:kv_transfer_failures_total{reason=\"peer_failed\"}"), 1);
  // With the prefill server gone, the next request's remote prefill fails at once: computed here.
  EXPECT_EQ(ids(complete(decode->port(), m.prompt, 6)), m.expected);
  EXPECT_EQ(metric(*decode, "mixkv:kv_transfer_failures_total{reason=\"peer_failed\"}"), 2);
  EXPECT_TRUE(idle(*decode)) << decode->metrics_text();
}

TEST(PdProcess, DecodeKilledMidTransferFreesThePrefillBlocks) {
  Instance ps("tiny-swa", "", 16, plan::Policy::kMixkv, 4ll << 20);
  ServeOptions po = serve_options(KvRole::kPrefill);
  po.kv.agent.lease = 10s;  // freed because UCX reports the reader dead, well before
  const auto prefill = serve(po, ps);
  Child child;
  child.spawn("decode-die@" + kv_peer(*prefill));
  const auto [http, kv] = child.ports();
  ASSERT_GT(http, 0) << "the decode process did not start";
  {
    httplib::Client c("127.0.0.1", http);
    c.set_read_timeout(20, 0);
    const auto res =
        c.Post("/v1/completions", json{{"prompt", long_prompt(70)}, {"max_tokens", 4}}.dump(),
               "application/json");
    EXPECT_FALSE(res) << "the decode process answered before dying";
  }
  EXPECT_EQ(child.wait_exit(), 128 + SIGKILL);  // by its own hand, once the offer came
  EXPECT_EQ(metric(*prefill, "mixkv:prompt_tokens_total"),
            kClientPrompt - 1);  // it prefilled and offered
  EXPECT_TRUE(idle(*prefill, 8s)) << prefill->metrics_text();
}

// Two hosts: two network namespaces joined by a veth pair, made here and removed after; the
// prefill server in one, the decode server (and its client) in the other, UCX and the control
// channel over TCP between them.
class PdTwoHosts : public mixkv::testing::TwoHostsTest {
 protected:
  PdTwoHosts() : TwoHostsTest("s", "10.178.0") {}
};

TEST_F(PdTwoHosts, DecodeHostServesTheTokensOfOneInstance) {
  Instance ds("tiny-swa", "", 16, plan::Policy::kMixkv, 4ll << 20);
  const TokenList expected = ds.generate({long_prompt(kClientPrompt)}, 6)[0];
  Child prefill;
  prefill.spawn("prefill@" + prefill_ip_, prefill_ns_);
  const auto [http, kv] = prefill.ports();
  ASSERT_GT(kv, 0) << "the prefill server did not start";
  Child decode;
  decode.spawn(fmt::format("decode-client@{}:{}", prefill_ip_, kv), decode_ns_);
  const std::string line = decode.line();
  EXPECT_EQ(line.substr(0, line.find(' ')), fmt::format("{}", fmt::join(expected, ",")));
  EXPECT_GT(std::stod(line.substr(line.find(' ') + 1)), 0) << line;  // pulled, not recomputed
  EXPECT_EQ(decode.wait_exit(), 0);
}

}  // namespace
}  // namespace mixkv::server
