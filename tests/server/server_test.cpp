// The server over tiny-swa, in process, through a real HTTP client (cpp-httplib's): greedy
// outputs equal `generate`'s, streams are well formed, concurrent clients share the batch, a
// client that leaves frees its blocks, the queue bound, the length limit, the key, the body
// limit, loading and draining. tests/server/clients_test.py runs the official clients.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <map>
#include <thread>

#include "cli/runner_setup.hpp"
#include "mixkv/engine/generator.hpp"
#include "mixkv/server/api.hpp"
#include "mixkv/server/server.hpp"
#include "mixkv/tokenizer/byte_tokenizer.hpp"
#include "mutation_fuzz.hpp"

namespace mixkv::server {
namespace {

using nlohmann::json;
using TokenList = std::vector<TokenId>;

#if defined(__SANITIZE_ADDRESS__)
constexpr int kClients = 8;
constexpr int kRequestsPerClient = 2;
#else
constexpr int kClients = 16;
constexpr int kRequestsPerClient = 4;
#endif

Limits limits() {
  Limits l;
  l.vocab_size = 260;
  return l;
}

// --- parsing ---

TEST(ApiParse, PromptTakesTextTokenIdsOrListsOfEither) {
  EXPECT_EQ(parse_completion(json{{"prompt", "hi"}}, limits()).prompts,
            (std::vector<Prompt>{{"hi", {}}}));
  EXPECT_EQ(parse_completion(json{{"prompt", {1, 2}}}, limits()).prompts,
            (std::vector<Prompt>{{std::nullopt, {1, 2}}}));
  EXPECT_EQ(parse_completion(json{{"prompt", {"a", "b"}}}, limits()).prompts.size(), 2u);
  EXPECT_EQ(parse_completion(json{{"prompt", {{1}, {2, 3}}}}, limits()).prompts[1].ids,
            (TokenList{2, 3}));
}

void expect_bad(const json& body, const std::string& param) {
  try {
    parse_completion(body, limits());
    ADD_FAILURE() << "accepted " << body.dump();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400) << body.dump();
    EXPECT_EQ(e.param(), param) << body.dump() << ": " << e.what();
    EXPECT_EQ(e.body()["error"]["param"], param);
  }
}

TEST(ApiParse, WrongTypesAndRangesNameTheField) {
  expect_bad(json::object(), "prompt");
  expect_bad(json{{"prompt", ""}}, "prompt");
  expect_bad(json{{"prompt", json::array()}}, "prompt");
  expect_bad(json{{"prompt", {1, 260}}}, "prompt");
  expect_bad(json{{"prompt", {"a", {1}}}}, "prompt");
  expect_bad(json{{"prompt", "a"}, {"max_tokens", 0}}, "max_tokens");
  expect_bad(json{{"prompt", "a"}, {"max_tokens", 1.5}}, "max_tokens");
  expect_bad(json{{"prompt", "a"}, {"stream", "yes"}}, "stream");
  expect_bad(json{{"prompt", "a"}, {"stream_options", {{"include_usage", 1}}}},
             "stream_options.include_usage");
  expect_bad(json{{"prompt", "a"}, {"temperature", 2.5}}, "temperature");
  expect_bad(json{{"prompt", "a"}, {"top_p", 0}}, "top_p");
  expect_bad(json{{"prompt", "a"}, {"top_k", -2}}, "top_k");
  expect_bad(json{{"prompt", "a"}, {"seed", "1"}}, "seed");
  expect_bad(json{{"prompt", "a"}, {"n", 2}}, "n");
  expect_bad(json{{"prompt", "a"}, {"stop", {"a", "b", "c", "d", "e"}}}, "stop");
  expect_bad(json{{"prompt", "a"}, {"stop", ""}}, "stop");
  expect_bad(json{{"prompt", "a"}, {"model", 3}}, "model");
  expect_bad(json{{"prompt", "a"}, {"logprobs", 2}}, "logprobs");
  expect_bad(json{{"prompt", "a"}, {"presence_penalty", 0.5}}, "presence_penalty");
}

TEST(ApiParse, UnknownFieldsAreIgnoredAndNullIsAbsent) {
  const CompletionRequest r = parse_completion(json{{"prompt", "a"},
                                                    {"user", "x"},
                                                    {"stop", nullptr},
                                                    {"temperature", 0.7},
                                                    {"top_k", 5},
                                                    {"seed", -3},
                                                    {"logprobs", nullptr},
                                                    {"n", nullptr},
                                                    {"max_tokens", 4.0}},
                                               limits());
  EXPECT_EQ(r.params.max_tokens, 4);
  EXPECT_EQ(r.params.sampling.temperature, 0.7);
  EXPECT_EQ(r.params.sampling.top_k, 5);
  EXPECT_EQ(r.params.sampling.seed, -3);
}

TEST(ApiParse, ChatMessagesTakeStringsOrTextParts) {
  const ChatRequest r = parse_chat(
      json{
          {"messages",
           {{{"role", "developer"}, {"content", "be brief"}},
            {{"role", "user"},
             {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}}}},
          {"max_completion_tokens", 3}},
      limits());
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "ab");
  EXPECT_EQ(r.params.max_tokens, 3);
  EXPECT_THROW(parse_chat(json{{"messages", {{{"role", "robot"}, {"content", "x"}}}}}, limits()),
               ApiError);
  EXPECT_THROW(parse_chat(json{{"messages", json::array()}}, limits()), ApiError);
}

TEST(ApiParse, MalformedJsonIsA400) {
  try {
    parse_body("{\"prompt\": ");
    ADD_FAILURE();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
  }
}

// Valid bodies of every endpoint with their values replaced by values of any type, members
// dropped or added, or the text cut or a byte changed: each parser returns a request or throws
// ApiError 400, never another exception (a JSON type error, say) that the HTTP layer would turn
// into a 500. schemathesis (tests/server/clients_test.py) does the same over HTTP;
// fuzz/http_body_fuzzer.cpp at length.
TEST(ApiParse, MutatedBodiesParseOrFailWithA400) {
  const std::vector<json> seeds = {
      json{{"prompt", "hi"},
           {"max_tokens", 4},
           {"stop", {"a", "b"}},
           {"stream", true},
           {"stream_options", {{"include_usage", true}}},
           {"temperature", 0.5},
           {"top_p", 0.9},
           {"top_k", 3},
           {"seed", 7},
           {"n", 1},
           {"logprobs", nullptr},
           {"presence_penalty", 0},
           {"model", "tiny-swa"},
           {"ignore_eos", false}},
      json{{"prompt", {{1, 2}, {3}}}, {"max_tokens", 2}, {"stop", "x"}},
      json{{"messages",
            {{{"role", "system"}, {"content", "be brief"}},
             {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "a"}}}}},
             {{"role", "assistant"}, {"content", "b"}}}},
           {"max_completion_tokens", 3},
           {"stream", false}},
      json{{"prompt", "hello"}, {"add_special_tokens", true}},
      json{{"tokens", {1, 2, 3}}, {"model", "tiny-swa"}}};
  static const std::vector<std::string> names = {"prompt",
                                                 "messages",
                                                 "tokens",
                                                 "max_tokens",
                                                 "max_completion_tokens",
                                                 "stop",
                                                 "stream",
                                                 "stream_options",
                                                 "temperature",
                                                 "top_p",
                                                 "top_k",
                                                 "seed",
                                                 "n",
                                                 "role",
                                                 "content",
                                                 "text"};
  const auto make = [&](std::uint64_t i) {
    mixkv::testing::FuzzRng rng = mixkv::testing::fuzz_rng(0x6d69786b76617069, i);  // "mixkvapi"
    json body = mixkv::testing::fuzz_pick(rng, seeds);
    for (auto edits = 1 + rng() % 3; edits > 0; --edits) {
      std::vector<json*> values;
      mixkv::testing::fuzz_values(body, values);
      json& at = *values[rng() % values.size()];
      if (at.is_object() && mixkv::testing::fuzz_chance(rng, 30)) {
        at[mixkv::testing::fuzz_pick(rng, names)] = mixkv::testing::fuzz_json_value(rng);
      } else if (at.is_structured() && !at.empty() && mixkv::testing::fuzz_chance(rng, 20)) {
        at.erase(at.begin());
      } else {
        at = mixkv::testing::fuzz_json_value(rng);
      }
    }
    std::string text = body.dump();
    if (mixkv::testing::fuzz_chance(rng, 20)) {
      const std::size_t cut = rng() % (text.size() + 1);
      if (mixkv::testing::fuzz_chance(rng, 50)) {
        text.resize(cut);
      } else if (cut < text.size()) {
        text[cut] = static_cast<char>(rng() & 0xFF);
      }
    }
    return text;
  };
  // Accepted: some endpoint's parser took the body.
  const auto check = [](const std::string& text, bool* accepted) -> std::string {
    std::string problem;
    const auto outcome = [&](const char* endpoint, const auto& parse) {
      try {
        parse(parse_body(text));
        *accepted = true;
      } catch (const ApiError& e) {
        if (e.status() != 400 && problem.empty()) {
          problem = fmt::format("{}: status {}: {}", endpoint, e.status(), e.what());
        }
      } catch (const std::exception& e) {
        if (problem.empty()) problem = fmt::format("{}: escaped as {}", endpoint, e.what());
      }
    };
    outcome("completions", [&](const json& b) { (void)parse_completion(b, limits()); });
    outcome("chat", [&](const json& b) { (void)parse_chat(b, limits()); });
    outcome("tokenize", [&](const json& b) { (void)parse_tokenize(b); });
    outcome("detokenize", [&](const json& b) { (void)parse_detokenize(b, limits()); });
    return problem;
  };
  mixkv::testing::run_fuzz("api fuzz", 4000, 10, make, check,
                           [](const std::string& text) { return text.substr(0, 2000); });
}

// --- the server over tiny-swa ---

// tiny-swa with the tiny-eagle drafter planned in (k = 3); the drafter is used or not per test.
struct Engine {
  cli::RunnerSetup setup = cli::prepare_runner("tiny-swa", "tiny-eagle", 3, 64ll << 20);
  runner::ModelRunner runner{setup.source, setup.weights, setup.options};
  std::unique_ptr<spec::Drafter> drafter = cli::make_drafter("tiny-eagle", runner, 0);
  tokenizer::ByteTokenizer tok;

  ServedModel served(bool with_drafter) {
    ServedModel m;
    m.runner = &runner;
    m.drafter = with_drafter ? drafter.get() : nullptr;
    m.num_spec_tokens = with_drafter ? 3 : 0;
    m.tokenizer = &tok;
    return m;
  }
};

Engine& shared_engine() {
  static Engine* e = new Engine();
  return *e;
}

ServeOptions options() {
  ServeOptions o;
  o.port = 0;
  o.served_model_name = "tiny-swa";
  o.shutdown_timeout = 10;
  return o;
}

std::vector<TokenList> prompts() {
  std::vector<TokenList> p;
  for (int i = 0; i < 4; ++i) {
    TokenList t;
    for (int j = 0; j < 5 + 7 * i; ++j) t.push_back(static_cast<TokenId>((31 * i + 7 * j) % 256));
    p.push_back(t);
  }
  return p;
}

std::vector<TokenList> offline(bool with_drafter, std::int64_t max_tokens) {
  Engine& e = shared_engine();
  engine::GenerateOptions go;
  go.max_tokens = max_tokens;
  go.num_spec_tokens = with_drafter ? 3 : 0;
  const auto p = prompts();
  const engine::GenerateReport r =
      engine::generate(e.runner, p, with_drafter ? e.drafter.get() : nullptr, go);
  std::vector<TokenList> out;
  for (const auto& q : r.requests) out.emplace_back(q.tokens.begin(), q.tokens.end());
  return out;
}

json post(httplib::Client& c, const std::string& path, const json& body, int* status = nullptr) {
  auto res = c.Post(path, body.dump(), "application/json");
  if (!res) {
    ADD_FAILURE() << "no answer from " << path;
    return {};
  }
  if (status != nullptr) *status = res->status;
  return json::parse(res->body, nullptr, false);
}

// The events of an SSE body: the JSON of each `data:` line, [DONE] as the string "[DONE]".
std::vector<json> events(const std::string& body) {
  std::vector<json> out;
  std::size_t at = 0;
  while (at < body.size()) {
    const std::size_t end = body.find("\n\n", at);
    EXPECT_NE(end, std::string::npos) << "an event without its blank line";
    if (end == std::string::npos) break;
    const std::string ev = body.substr(at, end - at);
    EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
    const std::string data = ev.substr(6);
    out.push_back(data == "[DONE]" ? json("[DONE]") : json::parse(data));
    at = end + 2;
  }
  return out;
}

// Streams one completion; returns its token ids, checking the stream's shape.
TokenList stream_tokens(httplib::Client& c, const TokenList& prompt, std::int64_t max_tokens) {
  const json body = {{"prompt", prompt},
                     {"max_tokens", max_tokens},
                     {"stream", true},
                     {"ignore_eos", true},
                     {"stream_options", {{"include_usage", true}}}};
  auto res = c.Post("/v1/completions", body.dump(), "application/json");
  EXPECT_TRUE(res);
  if (!res) return {};
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
  const std::vector<json> ev = events(res->body);
  EXPECT_GE(ev.size(), 3u);
  if (ev.size() < 3) return {};
  EXPECT_EQ(ev.back(), "[DONE]");
  const json& usage = ev[ev.size() - 2];
  EXPECT_TRUE(usage["choices"].empty());
  TokenList ids;
  int finishes = 0;
  for (std::size_t i = 0; i + 2 < ev.size(); ++i) {
    EXPECT_EQ(ev[i]["object"], "text_completion");
    EXPECT_EQ(ev[i]["id"], ev[0]["id"]);
    const json& ch = ev[i]["choices"][0];
    for (const auto& t : ch["token_ids"]) ids.push_back(t.get<TokenId>());
    if (!ch["finish_reason"].is_null()) {
      ++finishes;
      EXPECT_EQ(ch["finish_reason"], "length");
      EXPECT_EQ(i + 3, ev.size()) << "the finish event is the last choice event";
    }
  }
  EXPECT_EQ(finishes, 1);
  EXPECT_EQ(usage["usage"]["completion_tokens"], ids.size());
  EXPECT_EQ(usage["usage"]["prompt_tokens"], prompt.size());
  return ids;
}

// The samples of the text format whose name (with its labels, if `name` gives them) is `name`:
// "NAME VALUE" or "NAME{labels} VALUE" lines. No std::regex: GCC 12 warns inside it under
// the sanitizers.
std::vector<double> samples(const std::string& text, const std::string& name) {
  std::vector<double> out;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    if (line.empty() || line[0] == '#' || line.compare(0, name.size(), name) != 0) continue;
    const char next = line.size() > name.size() ? line[name.size()] : '\0';
    if (next != ' ' && !(next == '{' && name.find('{') == std::string::npos)) continue;
    out.push_back(std::stod(line.substr(line.rfind(' ') + 1)));
  }
  return out;
}

// The value of metric `name` (its first sample), -1 when absent.
double metric(const std::string& text, const std::string& name) {
  const std::vector<double> v = samples(text, name);
  return v.empty() ? -1 : v.front();
}

double kv_usage_sum(const std::string& text) {
  double sum = 0;
  for (const double v : samples(text, "mixkv:kv_cache_usage_perc")) sum += v;
  return sum;
}

// Waits (up to 5 s) until no request runs or waits and the cache holds nothing.
bool back_to_idle(const Server& s) {
  for (int i = 0; i < 500; ++i) {
    const std::string t = s.metrics_text();
    if (metric(t, "mixkv:num_requests_running") == 0 &&
        metric(t, "mixkv:num_requests_waiting") == 0 && kv_usage_sum(t) == 0) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << s.metrics_text();
  return false;
}

class ServerTest : public ::testing::TestWithParam<bool> {};

TEST_P(ServerTest, GreedyOutputsOverHttpEqualGenerate) {
  const bool drafter = GetParam();
  constexpr std::int64_t kTokens = 40;
  const std::vector<TokenList> want = offline(drafter, kTokens);
  Server s(options());
  s.start();
  s.attach(shared_engine().served(drafter));
  httplib::Client c("127.0.0.1", s.port());
  const auto p = prompts();
  for (std::size_t i = 0; i < p.size(); ++i) {
    int status = 0;
    const json r = post(c, "/v1/completions",
                        {{"prompt", p[i]},
                         {"max_tokens", kTokens},
                         {"ignore_eos", true},
                         {"temperature", 0},
                         {"model", "tiny-swa"}},
                        &status);
    ASSERT_EQ(status, 200) << r.dump();
    EXPECT_EQ(r["object"], "text_completion");
    EXPECT_EQ(r["choices"][0]["token_ids"].get<TokenList>(), want[i]) << "prompt " << i;
    EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(r["usage"]["completion_tokens"], kTokens);
    // The same through a stream.
    EXPECT_EQ(stream_tokens(c, p[i], kTokens), want[i]) << "prompt " << i << ", streamed";
  }
  // Several prompts in one request: one choice each, in order.
  const json multi =
      post(c, "/v1/completions",
           {{"prompt", {p[0], p[2]}}, {"max_tokens", kTokens}, {"ignore_eos", true}});
  ASSERT_EQ(multi["choices"].size(), 2u);
  EXPECT_EQ(multi["choices"][1]["index"], 1);
  EXPECT_EQ(multi["choices"][1]["token_ids"].get<TokenList>(), want[2]);
  // Text prompts through the byte vocabulary.
  const json text = post(c, "/v1/completions",
                         {{"prompt", std::string(p[0].begin(), p[0].end())},
                          {"max_tokens", kTokens},
                          {"ignore_eos", true}});
  EXPECT_EQ(text["choices"][0]["token_ids"].get<TokenList>(), want[0]);
  EXPECT_TRUE(back_to_idle(s));
  const std::string m = s.metrics_text();
  EXPECT_GT(metric(m, "mixkv:generation_tokens_total"), 0);
  EXPECT_GT(metric(m, "mixkv:time_to_first_token_seconds_count"), 0);
  if (drafter) {
    EXPECT_GT(metric(m, "mixkv:spec_decode_num_draft_tokens_total"), 0);
    EXPECT_GE(metric(m, "mixkv:spec_decode_num_accepted_tokens_per_pos_total{position=\"0\"}"), 0);
  }
  EXPECT_TRUE(s.shutdown());
}

TEST_P(ServerTest, ConcurrentStreamingClientsGetTheirOwnTokens) {
  const bool drafter = GetParam();
  constexpr std::int64_t kTokens = 24;
  const std::vector<TokenList> want = offline(drafter, kTokens);
  ServeOptions o = options();
  o.max_num_seqs = 8;
  o.max_queue = kClients * 2;
  Server s(o);
  s.start();
  s.attach(shared_engine().served(drafter));
  std::atomic<int> good{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      httplib::Client client("127.0.0.1", s.port());
      client.set_read_timeout(60);
      for (int r = 0; r < kRequestsPerClient; ++r) {
        const std::size_t i = static_cast<std::size_t>(c + r) % want.size();
        if (stream_tokens(client, prompts()[i], kTokens) == want[i]) ++good;
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(good, kClients * kRequestsPerClient);
  EXPECT_TRUE(back_to_idle(s));
  EXPECT_EQ(metric(s.metrics_text(), "mixkv:e2e_request_latency_seconds_count"),
            kClients * kRequestsPerClient);
  EXPECT_TRUE(s.shutdown());
}

INSTANTIATE_TEST_SUITE_P(PlainAndDrafter, ServerTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Drafter" : "Plain"; });

class ServerFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    ServeOptions o = options();
    o.max_num_seqs = 2;
    o.max_queue = 0;
    o.api_key = "";
    o.max_body_bytes = 16384;
    server_ = std::make_unique<Server>(o);
    server_->start();
    server_->attach(shared_engine().served(false));
  }
  std::unique_ptr<Server> server_;
};

TEST_F(ServerFaults, AClientThatLeavesFreesItsBlocks) {
  const TokenList prompt = prompts()[3];
  // Streaming: read one event, then hang up.
  {
    httplib::Client c("127.0.0.1", server_->port());
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.set_header("Content-Type", "application/json");
    req.body =
        json{{"prompt", prompt}, {"max_tokens", 1900}, {"stream", true}, {"ignore_eos", true}}
            .dump();
    int chunks = 0;
    req.content_receiver = [&](const char*, std::size_t, std::uint64_t, std::uint64_t) {
      return ++chunks < 1;
    };
    c.send(req);
    EXPECT_GE(chunks, 1);
  }
  EXPECT_TRUE(back_to_idle(*server_));
  // Not streaming: hang up before the answer.
  {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(0, 50000);  // 50 ms: the client gives up and closes
    c.Post("/v1/completions",
           json{{"prompt", prompt}, {"max_tokens", 1900}, {"ignore_eos", true}}.dump(),
           "application/json");
  }
  EXPECT_TRUE(back_to_idle(*server_));
  EXPECT_LT(metric(server_->metrics_text(), "mixkv:generation_tokens_total"), 2 * 1900);
  // Still serving.
  httplib::Client c("127.0.0.1", server_->port());
  int status = 0;
  post(c, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 4}}, &status);
  EXPECT_EQ(status, 200);
}

TEST_F(ServerFaults, BeyondTheQueueA503WithRetryAfter) {
  // max_num_seqs 2, max_queue 0: with two long requests running, a third is refused. A long
  // request may finish before the third arrives on a loaded machine: then try again.
  bool refused = false;
  for (int attempt = 0; attempt < 5 && !refused; ++attempt) {
    std::vector<std::thread> longs;
    std::atomic<int> served{0};
    for (int i = 0; i < 2; ++i) {
      longs.emplace_back([&] {
        httplib::Client c("127.0.0.1", server_->port());
        c.set_read_timeout(60);
        auto r = c.Post(
            "/v1/completions",
            json{{"prompt", prompts()[1]}, {"max_tokens", 1900}, {"ignore_eos", true}}.dump(),
            "application/json");
        if (r && r->status == 200) ++served;
      });
    }
    for (int i = 0; i < 500; ++i) {
      if (metric(server_->metrics_text(), "mixkv:num_requests_running") == 2) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    httplib::Client c("127.0.0.1", server_->port());
    auto res = c.Post("/v1/completions", json{{"prompt", "x"}, {"max_tokens", 2}}.dump(),
                      "application/json");
    ASSERT_TRUE(res);
    if (res->status == 503) {
      refused = true;
      EXPECT_EQ(res->get_header_value("Retry-After"), "1");
      const json e = json::parse(res->body);
      EXPECT_EQ(e["error"]["code"], "queue_full");
    } else {
      EXPECT_EQ(res->status, 200);
    }
    for (auto& t : longs) t.join();
    EXPECT_EQ(served, 2) << "the two running requests are served";
  }
  EXPECT_TRUE(refused);
  EXPECT_TRUE(back_to_idle(*server_));
}

TEST_F(ServerFaults, BadRequestsGetOpenAiErrorsAndTheServerKeepsServing) {
  httplib::Client c("127.0.0.1", server_->port());
  auto check = [&](httplib::Result res, int status, const std::string& needle) {
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, status) << res->body;
    const json e = json::parse(res->body, nullptr, false);
    ASSERT_TRUE(e.contains("error")) << res->body;
    for (const char* k : {"message", "type", "param", "code"}) {
      EXPECT_TRUE(e["error"].contains(k)) << k << " in " << res->body;
    }
    EXPECT_NE(e["error"]["message"].get<std::string>().find(needle), std::string::npos)
        << res->body;
  };
  check(c.Post("/v1/completions", "{not json", "application/json"), 400, "not valid JSON");
  check(c.Post("/v1/completions", "[1]", "application/json"), 400, "JSON object");
  check(c.Post("/v1/completions", R"({"prompt": "a", "max_tokens": "3"})", "application/json"), 400,
        "max_tokens");
  check(c.Post("/v1/completions", R"({"prompt": "a", "model": "gpt-4"})", "application/json"), 404,
        "gpt-4");
  check(c.Get("/v2/nothing"), 404, "no route");
  check(c.Post("/v1/completions", std::string(32768, ' '), "application/json"), 413, "larger");
  // Too long: both numbers.
  const TokenList long_prompt(2040, 65);
  check(c.Post("/v1/completions", json{{"prompt", long_prompt}, {"max_tokens", 100}}.dump(),
               "application/json"),
        400, "2048");
  check(c.Post("/v1/completions", json{{"prompt", long_prompt}, {"max_tokens", 100}}.dump(),
               "application/json"),
        400, "2140");
  check(c.Post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}]})",
               "application/json"),
        400, "chat template");
  // Still serving, and /tokenize round-trips through /detokenize.
  int status = 0;
  const json t = post(c, "/tokenize", {{"prompt", "hello"}}, &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(t["count"], 5);
  const json d = post(c, "/detokenize", {{"tokens", t["tokens"]}});
  EXPECT_EQ(d["prompt"], "hello");
  const json m = json::parse(c.Get("/v1/models")->body);
  EXPECT_EQ(m["data"][0]["id"], "tiny-swa");
  EXPECT_EQ(m["data"][0]["max_model_len"], 2048);
  const json api = json::parse(c.Get("/openapi.json")->body);
  EXPECT_EQ(api["openapi"], "3.1.0");
  EXPECT_TRUE(api["paths"].contains("/v1/chat/completions"));
  EXPECT_EQ(c.Get("/health")->status, 200);
}

TEST(ServerLifecycle, HealthIs503UntilTheModelIsAttached) {
  Server s(options());
  s.start();
  httplib::Client c("127.0.0.1", s.port());
  EXPECT_EQ(c.Get("/health")->status, 503);
  auto res = c.Post("/v1/completions", R"({"prompt": "a"})", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(res->get_header_value("Retry-After"), "1");
  s.attach(shared_engine().served(false));
  EXPECT_EQ(c.Get("/health")->status, 200);
  EXPECT_TRUE(s.shutdown());
}

TEST(ServerLifecycle, TheApiKeyIsAskedOnTheApiRoutesOnly) {
  ServeOptions o = options();
  o.api_key = "sesame";
  Server s(o);
  s.start();
  s.attach(shared_engine().served(false));
  httplib::Client c("127.0.0.1", s.port());
  auto res = c.Post("/v1/completions", R"({"prompt": "a", "max_tokens": 2})", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 401);
  EXPECT_EQ(json::parse(res->body)["error"]["code"], "invalid_api_key");
  c.set_bearer_token_auth("wrong");
  EXPECT_EQ(c.Get("/v1/models")->status, 401);
  c.set_bearer_token_auth("sesame");
  EXPECT_EQ(
      c.Post("/v1/completions", R"({"prompt": "a", "max_tokens": 2})", "application/json")->status,
      200);
  httplib::Client open("127.0.0.1", s.port());
  EXPECT_EQ(open.Get("/health")->status, 200);
  EXPECT_EQ(open.Get("/metrics")->status, 200);
  EXPECT_TRUE(s.shutdown());
}

TEST(ServerLifecycle, ShutdownLetsRunningStreamsFinishAndRefusesNewOnes) {
  Server s(options());
  s.start();
  s.attach(shared_engine().served(false));
  TokenList got;
  std::thread stream([&] {
    httplib::Client c("127.0.0.1", s.port());
    c.set_read_timeout(60);
    got = stream_tokens(c, prompts()[0], 1500);
  });
  for (int i = 0; i < 2000; ++i) {
    if (metric(s.metrics_text(), "mixkv:num_requests_running") == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::atomic<bool> drained{false};
  std::thread stopper([&] { drained = s.shutdown(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  httplib::Client c("127.0.0.1", s.port());
  auto res = c.Post("/v1/completions", R"({"prompt": "a", "max_tokens": 2})", "application/json");
  if (res) {
    EXPECT_EQ(res->status, 503);  // or no answer once the listener closed
  }
  stopper.join();
  stream.join();
  EXPECT_TRUE(drained);
  EXPECT_EQ(got.size(), 1500u);
}

}  // namespace
}  // namespace mixkv::server
