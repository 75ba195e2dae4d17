// The HTTP side of `mixkv serve` (cpp-httplib: one worker thread per open connection) and the
// engine thread that owns the scheduler. They meet in Impl::mu: HTTP threads queue jobs and set
// cancel flags; the engine thread, between steps, admits the queued jobs into the scheduler,
// cancels the flagged ones (their blocks return to the pool before the next step), steps, and
// hands each job its new tokens. docs/server.md.
#include "mixkv/server/server.hpp"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <filesystem>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "metrics.hpp"
#include "mixkv/core/error.hpp"
#include "mixkv/core/json_int.hpp"
#include "mixkv/engine/generator.hpp"
#include "mixkv/sched/scheduler.hpp"
#include "mixkv/server/api.hpp"

namespace mixkv::server {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
constexpr std::size_t kNoId = std::numeric_limits<std::size_t>::max();
// A finished scheduler record costs little, but a server runs for days: when idle with this many
// records, the engine starts a fresh Scheduler over the same manager (the prefix cache stays).
constexpr std::size_t kRenewAfter = 4096;
// How often a waiting HTTP thread looks whether its client is still there.
constexpr auto kPollInterval = std::chrono::milliseconds(20);

// One choice being generated, shared by its HTTP thread and the engine thread (under Impl::mu).
struct Job {
  std::vector<TokenId> prompt;
  std::int64_t max_tokens = 1;
  bool stop_at_eos = true;
  sample::SamplingParams sampling;  // greedy unless the request gave a temperature
  std::vector<TokenId> tokens;      // generated so far, never past max_tokens or an EOS
  bool done = false;
  std::string finish_reason;  // "stop" or "length" once done without error
  std::string error;          // the engine could not finish it
  bool cancel = false;        // the client left, or a stop sequence matched
  std::size_t sched = kNoId;
  Clock::time_point arrival, last_emit;
  bool emitted = false;
  // --kv-role prefill: a /v1/kv/prefill job, whose blocks are offered once its prompt is
  // computed. Its offer id (prefill), or the prefill side's request to pull (decode; -1: none).
  bool hold = false;
  std::int64_t kv_request = -1;
  std::string load_error;  // decode, engine thread: why the pull failed the request
};
using JobPtr = std::shared_ptr<Job>;

// The engine's sampling parameters for a request's fields. An absent temperature is greedy (not
// OpenAI's default of 1), so a client that sends none gets the reproducible greedy reply; choice
// `choice` of a request draws with seed + choice. Without a seed, the draws are seeded from the
// clock.
sample::SamplingParams sampling_params(const Sampling& s, std::size_t choice) {
  sample::SamplingParams p;
  p.temperature = s.temperature.value_or(0.0);
  p.top_p = s.top_p.value_or(1.0);
  p.top_k = static_cast<int>(s.top_k.value_or(0));
  const std::uint64_t seed =
      s.seed ? static_cast<std::uint64_t>(*s.seed)
             : static_cast<std::uint64_t>(Clock::now().time_since_epoch().count());
  p.seed = seed + choice;
  return p;
}

// cpp-httplib listens with a backlog of 5: a burst of clients then waits a SYN retry (1 s).
// Linux takes a second listen() on the bound socket as a new backlog.
class HttpServer final : public httplib::Server {
 public:
  void widen_backlog(int backlog) {
    if (svr_sock_ != INVALID_SOCKET) ::listen(svr_sock_, backlog);
  }
};

std::uint16_t port_of(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  return 0;
}

std::string address_of(const sockaddr_storage& a) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, buf, sizeof buf);
  } else if (a.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(a).sin6_addr, buf, sizeof buf);
  }
  return buf;
}

// cpp-httplib 0.11 does not tell a handler its socket, nor whether the client closed it; a
// closed peer only shows when a write fails, which a request still queued or in prefill never
// does. The socket is the one open descriptor with this request's two addresses.
// /proc/self/fd lists the open descriptors (a few per connection), where a scan up to
// RLIMIT_NOFILE could make a million system calls.
bool matches(int fd, const httplib::Request& req) {
  sockaddr_storage local{}, peer{};
  socklen_t len = sizeof local;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) return false;
  if (port_of(local) != req.local_port) return false;
  len = sizeof peer;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) return false;
  return port_of(peer) == req.remote_port && address_of(peer) == req.remote_addr;
}

int connection_fd(const httplib::Request& req) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    int fd = -1;
    const std::string name = entry.path().filename().string();
    if (std::from_chars(name.data(), name.data() + name.size(), fd).ec != std::errc{}) continue;
    if (matches(fd, req)) return fd;
  }
  if (ec) {  // no /proc: the low descriptors
    for (int fd = 0; fd < 1024; ++fd) {
      if (matches(fd, req)) return fd;
    }
  }
  return -1;
}

bool client_gone(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  if (e.status() == 503) res.set_header("Retry-After", "1");
  send_json(res, e.status(), e.body());
}

std::string sse(const json& j) {
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

// Text of one choice as its tokens arrive: UTF-8 kept whole, stop sequences cut off, and the
// tail that may still become a stop sequence held back.
class ChoiceText {
 public:
  ChoiceText(const tokenizer::Tokenizer* tok, std::vector<std::string> stop)
      : stop_(std::move(stop)) {
    if (tok != nullptr) decoder_.emplace(*tok);
  }
  // Adds a token; returns false once a stop sequence matched (the token is then not counted).
  bool push(TokenId id) {
    if (stopped_) return false;
    ids_.push_back(id);
    if (decoder_) all_ += decoder_->push(id);
    return !check_stop();
  }
  void finish() {
    if (decoder_ && !stopped_) {
      all_ += decoder_->finish();
      check_stop();
    }
    finished_ = true;
  }
  // Text safe to send now.
  std::string take() {
    std::size_t safe = all_.size();
    if (!finished_ && !stopped_) {
      for (const std::string& s : stop_) {
        for (std::size_t k = std::min(s.size() - 1, all_.size()); k > 0; --k) {
          if (all_.compare(all_.size() - k, k, s, 0, k) == 0) {
            safe = std::min(safe, all_.size() - k);
            break;
          }
        }
      }
    }
    safe = std::max(safe, sent_);
    std::string out = all_.substr(sent_, safe - sent_);
    sent_ = safe;
    return out;
  }
  bool stopped() const { return stopped_; }
  const std::vector<TokenId>& ids() const { return ids_; }

 private:
  bool check_stop() {
    for (const std::string& s : stop_) {
      const std::size_t from = sent_ >= s.size() ? sent_ - s.size() + 1 : 0;
      if (const std::size_t at = all_.find(s, std::min(from, all_.size()));
          at != std::string::npos) {
        all_.resize(at);
        stopped_ = true;
      }
    }
    return stopped_;
  }
  std::optional<tokenizer::StreamDecoder> decoder_;
  std::vector<std::string> stop_;
  std::vector<TokenId> ids_;
  std::string all_;
  std::size_t sent_ = 0;
  bool stopped_ = false, finished_ = false;
};

}  // namespace

struct Server::Impl {
  explicit Impl(ServeOptions o) : opt(std::move(o)) {}

  ServeOptions opt;
  HttpServer http;
  std::thread listener, engine_thread;
  // --kv-role decode: the pulls run here, off the engine thread, so the running batch keeps
  // stepping while a request's KV arrives; the decode agent is used by this thread only.
  std::thread pull_thread;
  int bound_port = 0;
  std::atomic<bool> ready{false}, draining{false}, stopped{false};
  std::atomic<bool> listener_done{false};  // listen_after_bind() has returned
  std::atomic<std::uint64_t> next_id{0};
  Metrics metrics;

  // Set once by attach(), then read-only (the scheduler and friends: the engine thread's).
  ServedModel model;
  Limits limits;
  std::int64_t max_model_len = 0;
  int k = 0;
  std::unique_ptr<engine::RunnerModel> runner_model;
  std::unique_ptr<cache::KvCacheManager> manager;
  std::unique_ptr<sched::Scheduler> scheduler;
  sched::Counters seen;  // the scheduler's counters already added to the metrics

  // P/D disaggregation (--kv-role): one agent, over the runner's cache tensors.
  std::unique_ptr<transfer::PrefillAgent> prefill_agent;
  std::unique_ptr<transfer::DecodeAgent> decode_agent;
  std::string peer_host;  // decode: the prefill side's address, its agent's and HTTP ports
  std::uint16_t peer_port = 0;
  int control_port = 0;
  std::atomic<std::int64_t> next_offer{1};
  std::unordered_map<std::int64_t, std::size_t> held;  // prefill: offer id -> scheduler id
  // Decode: a pull the scheduler's start_load asked for, and its answer for complete_load().
  struct Pull {
    std::size_t sched = 0;
    std::int64_t kv_request = 0;
    std::int64_t boundary = 0;  // the prompt's tokens but the last
    std::int64_t hit = 0;
    transfer::RequestBlocks blocks;
  };
  struct Loaded {
    std::size_t sched = 0;
    std::optional<std::int64_t> tokens;
    std::string error;  // --kv-load-failure fail: why
  };

  std::mutex mu;
  std::condition_variable engine_cv, jobs_cv;
  std::vector<JobPtr> inbox;
  std::unordered_map<std::size_t, JobPtr> active;
  std::size_t sched_waiting = 0;  // the scheduler's, as of the last step
  std::int64_t sched_running = 0;
  bool cancel_pending = false;
  bool stop_engine = false;
  std::condition_variable pull_cv;  // the pull thread waits for work
  std::deque<Pull> pulls;           // under mu: asked, not started
  std::vector<Loaded> loaded;       // under mu: finished, for the engine thread
  bool pulling = false;             // under mu: the pull thread is in a pull
  bool stop_pulls = false;
  int open_requests = 0;  // handlers and streams still answering

  std::string name() const { return opt.served_model_name; }

  // --- engine thread ---
  void new_scheduler() {
    sched::SchedulerOptions so;
    so.num_spec_tokens = k;
    so.max_batch = opt.max_num_seqs;
    so.prefill_chunk = opt.prefill_chunk;
    // Each request's draft length follows its acceptance, as in `generate`: a request whose drafts
    // keep failing decodes plainly instead of paying for verify rows.
    so.adaptive_draft = true;
    if (decode_agent) {
      so.start_load = [this](std::size_t i, const cache::KvCacheManager& m, cache::RequestId id,
                             std::int64_t hit) { return start_load(i, m, id, hit); };
    }
    scheduler = std::make_unique<sched::Scheduler>(*manager, model.runner->plan(), so);
    seen = {};
  }

  spec::Drafter* drafter() const { return k > 0 ? model.drafter : nullptr; }

  // A request's manager block ids per KV-cache group, as the transfer plans read them.
  transfer::RequestBlocks blocks_of(const cache::KvCacheManager& m, cache::RequestId id) const {
    transfer::RequestBlocks b;
    for (std::size_t g = 0; g < model.runner->plan().groups.size(); ++g) {
      b.groups.emplace_back();
      for (const cache::BlockId x : m.block_table(id, static_cast<int>(g))) {
        b.groups.back().push_back(x.value());
      }
    }
    return b;
  }

  // Decode side, engine thread, inside the scheduler's admission of request i: hands the pull
  // of what the prefill side computed of its prompt (all but the last token) beyond the prefix
  // hit, into the blocks just allocated, to the pull thread. False when nothing is to be pulled
  // (the remote prefill failed: the prompt is computed here).
  bool start_load(std::size_t i, const cache::KvCacheManager& m, cache::RequestId id,
                  std::int64_t hit) {
    const auto it = active.find(i);
    if (it == active.end() || it->second->kv_request < 0) return false;
    Pull p;
    p.sched = i;
    p.kv_request = it->second->kv_request;
    p.boundary = static_cast<std::int64_t>(it->second->prompt.size()) - 1;
    p.hit = hit;
    p.blocks = blocks_of(m, id);
    std::lock_guard lk(mu);
    pulls.push_back(std::move(p));
    pull_cv.notify_one();
    return true;
  }

  // Decode side, the pull thread: one pull after another. A failure counts by reason and
  // recomputes (answers the hit) or, with --kv-load-failure fail, fails the request.
  void pull_loop() {
    std::unique_lock lk(mu);
    for (;;) {
      pull_cv.wait(lk, [&] { return stop_pulls || !pulls.empty(); });
      if (stop_pulls) break;
      Pull p = std::move(pulls.front());
      pulls.pop_front();
      pulling = true;
      lk.unlock();
      Loaded l = pull(p);
      lk.lock();
      pulling = false;
      loaded.push_back(std::move(l));
      engine_cv.notify_all();
    }
  }

  Loaded pull(const Pull& p) {
    Loaded l{p.sched, p.hit, {}};
    auto failed = [&](std::string_view reason, const std::string& message) {
      metrics.transfer_failure(std::string(reason)).Increment();
      if (opt.kv.fail_on_load_failure) {
        l.tokens = std::nullopt;
        l.error =
            fmt::format("the KV transfer from the prefill server failed ({}): {}", reason, message);
      }
      return l;
    };
    if (decode_agent->num_peers() == 0) {
      // The prefill server answered this request's prefill, so it is back: join it again.
      try {
        decode_agent->connect(peer_host, peer_port);
      } catch (const Error& e) {
        return failed(transfer::to_string(transfer::FailureReason::kPeerFailed), e.what());
      }
    }
    // A prefix hit covering the boundary still pulls (nothing but recurrent states), so the
    // prefill side hears DONE and frees its blocks now.
    const transfer::PullResult r =
        decode_agent->pull(p.kv_request, p.blocks, {p.boundary, std::min(p.hit, p.boundary)});
    if (!r.ok()) return failed(transfer::to_string(r.reason), r.message);
    metrics.transfer_bytes->Increment(static_cast<double>(r.bytes));
    metrics.transfer_latency->Observe(r.seconds);
    l.tokens = p.boundary;
    return l;
  }

  // Decode side, engine thread between steps: the finished pulls' requests start running (or
  // recompute, or fail); one cancelled while it loaded ends now.
  void complete_loads() {
    for (Loaded& l : loaded) {
      const auto it = active.find(l.sched);
      if (it != active.end()) {
        it->second->load_error = std::move(l.error);
        cancel_pending |= it->second->cancel;
      }
      scheduler->complete_load(l.sched, l.tokens);
    }
    if (!loaded.empty()) collect();
    loaded.clear();
  }

  // Decode side, engine thread, before the scheduler is replaced: no pull may still write into
  // the old one's blocks.
  void drop_pulls(std::unique_lock<std::mutex>& lk) {
    pulls.clear();  // never started: their offers end with the prefill side's lease
    engine_cv.wait(lk, [&] { return !pulling; });
    loaded.clear();
  }

  // Prefill side, engine thread: frees the blocks of requests every reader finished with (or
  // whose lease expired).
  void release_held() {
    if (!prefill_agent) return;
    for (const transfer::Release& r : prefill_agent->take_released()) {
      const auto it = held.find(r.request);
      if (it == held.end()) continue;  // held by a scheduler the engine replaced after a failure
      scheduler->free_held(it->second);
      held.erase(it);
    }
    metrics.transfer_held->Set(static_cast<double>(held.size()));
  }

  void finish(Job& j, std::string reason) {
    j.done = true;
    j.finish_reason = std::move(reason);
    const auto now = Clock::now();
    metrics.e2e->Observe(std::chrono::duration<double>(now - j.arrival).count());
    metrics.prompt_tokens->Increment(static_cast<double>(j.prompt.size()));
    metrics.generation_tokens->Increment(static_cast<double>(j.tokens.size()));
  }

  void export_counters() {
    const sched::Counters& c = scheduler->counters();
    metrics.prefix_queries->Increment(static_cast<double>(c.prompt_tokens - seen.prompt_tokens));
    metrics.prefix_hits->Increment(static_cast<double>(c.hit_tokens - seen.hit_tokens));
    metrics.preemptions->Increment(static_cast<double>(c.preemptions - seen.preemptions));
    if (drafter() != nullptr) {
      metrics.drafts->Increment(static_cast<double>(c.decode_steps - seen.decode_steps));
    }
    metrics.draft_tokens->Increment(static_cast<double>(c.drafted_tokens - seen.drafted_tokens));
    metrics.accepted_tokens->Increment(
        static_cast<double>(c.accepted_tokens - seen.accepted_tokens));
    for (std::size_t p = 0; p < c.accepted_per_position.size(); ++p) {
      const std::int64_t before =
          p < seen.accepted_per_position.size() ? seen.accepted_per_position[p] : 0;
      metrics.accepted_at(p).Increment(static_cast<double>(c.accepted_per_position[p] - before));
    }
    seen = c;
    // Requests waiting for their pulls are admitted: they count as running.
    sched_running = static_cast<std::int64_t>(scheduler->num_running() + scheduler->num_loading());
    metrics.running->Set(static_cast<double>(sched_running));
    sched_waiting = scheduler->num_waiting();
    metrics.waiting->Set(static_cast<double>(sched_waiting + inbox.size()));
    const double usable = static_cast<double>(std::max(1, manager->pool().num_blocks() - 1));
    const std::vector<cache::GroupStats> groups = manager->stats();
    for (std::size_t g = 0; g < groups.size() && g < metrics.kv_usage.size(); ++g) {
      metrics.kv_usage[g]->Set(static_cast<double>(groups[g].blocks_held) / usable);
    }
  }

  // New tokens to their jobs; EOS and max_tokens end them.
  void collect() {
    const auto now = Clock::now();
    const tokenizer::Tokenizer* tok = model.tokenizer;
    for (auto it = active.begin(); it != active.end();) {
      const std::size_t id = it->first;
      Job& j = *it->second;
      if (j.hold || scheduler->load_failed(id)) {
        if (!scheduler->finished(id)) {
          ++it;
          continue;
        }
        if (j.hold) {
          // Prefilled: its blocks stay pinned for the decode side that asked.
          j.kv_request = next_offer++;
          prefill_agent->offer(j.kv_request,
                               blocks_of(*manager, cache::RequestId(static_cast<std::int64_t>(id))),
                               static_cast<std::int64_t>(j.prompt.size()));
          held[j.kv_request] = id;
          finish(j, "length");
        } else {
          j.error = j.load_error;
          j.done = true;
        }
        scheduler->release(id);
        it = active.erase(it);
        continue;
      }
      const std::span<const TokenId> out = scheduler->outputs(id);
      bool eos = false;
      const std::size_t before = j.tokens.size();
      for (std::size_t i = before;
           i < out.size() && static_cast<std::int64_t>(j.tokens.size()) < j.max_tokens; ++i) {
        j.tokens.push_back(out[i]);
        if (j.stop_at_eos && tok != nullptr && tok->is_end_of_generation(out[i])) {
          eos = true;
          break;
        }
      }
      if (j.tokens.size() > before) {
        const double since =
            std::chrono::duration<double>(now - (j.emitted ? j.last_emit : j.arrival)).count();
        (j.emitted ? metrics.itl : metrics.ttft)->Observe(since);
        j.emitted = true;
        j.last_emit = now;
      }
      const bool full = static_cast<std::int64_t>(j.tokens.size()) >= j.max_tokens;
      if (eos || full || scheduler->finished(id)) {
        if (!scheduler->finished(id)) scheduler->cancel(id, drafter());
        finish(j, eos ? "stop" : "length");
        scheduler->release(id);
        it = active.erase(it);
      } else {
        ++it;
      }
    }
  }

  void fail_all(const std::string& message) {
    for (auto& [id, j] : active) {
      j->error = message;
      j->done = true;
      if (model.drafter != nullptr) model.drafter->forget(id);
    }
    active.clear();
    held.clear();  // the manager is replaced; the agent's leases end those offers
  }

  void engine_loop() {
    std::unique_lock lk(mu);
    for (;;) {
      // Requests that only wait for their pulls give the engine nothing to step.
      const auto woken = [&] {
        return stop_engine || !inbox.empty() || cancel_pending || !loaded.empty() ||
               scheduler->num_running() > 0 ||
               (scheduler->num_waiting() > 0 && scheduler->num_loading() == 0);
      };
      if (held.empty()) {
        engine_cv.wait(lk, woken);
      } else {
        engine_cv.wait_for(lk, std::chrono::milliseconds(5), woken);  // releases come by UCX
      }
      if (stop_engine) break;
      release_held();
      complete_loads();
      for (const JobPtr& j : inbox) {
        j->sched = scheduler->add({j->prompt, j->max_tokens, fmt::format("request {}", next_id++),
                                   j->stop_at_eos ? model.stop_tokens : std::vector<TokenId>{},
                                   j->sampling, j->hold, j->kv_request >= 0});
        active[j->sched] = j;
      }
      inbox.clear();
      if (cancel_pending) {
        cancel_pending = false;
        for (auto it = active.begin(); it != active.end();) {
          Job& j = *it->second;
          if (!j.cancel) {
            ++it;
            continue;
          }
          scheduler->cancel(it->first, drafter());
          if (!scheduler->finished(it->first)) {  // its pull runs: it ends at complete_load()
            ++it;
            continue;
          }
          scheduler->release(it->first);
          finish(j, "stop");
          it = active.erase(it);
        }
      }
      if (scheduler->idle()) {
        if (scheduler->num_requests() >= kRenewAfter && held.empty()) new_scheduler();
        export_counters();
        jobs_cv.notify_all();
        continue;
      }
      lk.unlock();
      std::string failure;
      try {
        scheduler->step(*runner_model, drafter());
      } catch (const std::exception& e) {
        failure = e.what();
      }
      lk.lock();
      if (!failure.empty()) {
        // The scheduler may be mid-step: start over with a fresh manager and scheduler.
        fail_all(fmt::format("the engine failed a step: {}", failure));
        drop_pulls(lk);
        manager = std::make_unique<cache::KvCacheManager>(
            model.runner->plan(), k, cache::ManagerOptions{opt.prefix_caching, 0, 0});
        new_scheduler();
      } else {
        collect();
      }
      export_counters();
      jobs_cv.notify_all();
    }
    fail_all("the server stopped");
    drop_pulls(lk);
    for (const JobPtr& j : inbox) j->error = "the server stopped", j->done = true;
    inbox.clear();
    jobs_cv.notify_all();
  }

  // --- HTTP threads ---
  void check_model_name(const GenerationParams& p) const {
    if (p.model && *p.model != name()) {
      throw ApiError(404,
                     fmt::format("the model '{}' does not exist; this server serves '{}'",
                                 printable(*p.model), name()),
                     "invalid_request_error", "model", "model_not_found");
    }
  }

  std::vector<TokenId> tokenize(const std::string& text, bool add_special) const {
    if (model.tokenizer == nullptr) {
      throw ApiError(400,
                     fmt::format("{} has no tokenizer: send prompts as token-id lists", name()),
                     "invalid_request_error", "prompt");
    }
    tokenizer::EncodeOptions eo;
    eo.add_special = add_special;
    return model.tokenizer->encode(text, eo);
  }

  // Jobs for the prompts, or ApiError: the prompt empty, too long, or the server full.
  std::vector<JobPtr> submit(std::vector<std::vector<TokenId>> prompts, const GenerationParams& p,
                             std::int64_t default_max_tokens, bool hold = false) {
    std::vector<JobPtr> jobs;
    const auto now = Clock::now();
    for (auto& prompt : prompts) {
      const auto len = static_cast<std::int64_t>(prompt.size());
      if (len == 0)
        throw ApiError(400, "the prompt has no tokens", "invalid_request_error", "prompt");
      const std::int64_t room = max_model_len - len - k;
      const std::int64_t max_tokens =
          p.max_tokens
              ? *p.max_tokens
              : std::clamp<std::int64_t>(default_max_tokens, 1, std::max<std::int64_t>(room, 1));
      if (len + max_tokens + k > max_model_len) {
        throw ApiError(
            400,
            fmt::format("this model's maximum context length is {} tokens; the request asks for "
                        "{} ({} in the prompt, {} to generate{}); shorten the prompt or lower "
                        "max_tokens",
                        max_model_len, len + max_tokens + k, len, max_tokens,
                        k > 0 ? fmt::format(", {} speculative look-ahead", k) : ""),
            "invalid_request_error", p.max_tokens ? "max_tokens" : "prompt",
            "context_length_exceeded");
      }
      auto j = std::make_shared<Job>();
      j->prompt = std::move(prompt);
      j->max_tokens = max_tokens;
      j->stop_at_eos = !p.ignore_eos;
      j->sampling = sampling_params(p.sampling, jobs.size());
      j->arrival = now;
      j->hold = hold;
      jobs.push_back(std::move(j));
    }
    if (decode_agent) {
      for (const JobPtr& j : jobs) remote_prefill(*j);
    }
    std::lock_guard lk(mu);
    if (draining) {
      throw ApiError(503, "the server is shutting down", "service_unavailable", {},
                     "shutting_down");
    }
    // The requests that would wait once the free places of the running batch are taken.
    const auto pending = static_cast<std::int64_t>(sched_waiting + inbox.size() + jobs.size());
    const std::int64_t free_places = std::max<std::int64_t>(0, opt.max_num_seqs - sched_running);
    if (pending - free_places > opt.max_queue) {
      throw ApiError(
          503,
          fmt::format("the server is full: {} requests wait (--max-queue {}); retry "
                      "later",
                      std::max<std::int64_t>(
                          0, pending - free_places - static_cast<std::int64_t>(jobs.size())),
                      opt.max_queue),
          "service_unavailable", {}, "queue_full");
    }
    for (const JobPtr& j : jobs) inbox.push_back(j);
    engine_cv.notify_one();
    return jobs;
  }

  // Decode side, HTTP thread: asks the prefill server to prefill the prompt but its last token
  // (POST /v1/kv/prefill); its answer names the request to pull at admission. A failure counts
  // by reason, then the prompt is computed here, or (--kv-load-failure fail) the request gets 503.
  void remote_prefill(Job& j) {
    if (j.prompt.size() < 2) return;  // nothing before the last token
    httplib::Client cli(peer_host, control_port);
    const auto timeout = opt.kv.agent.timeout;
    cli.set_connection_timeout(std::chrono::duration_cast<std::chrono::microseconds>(timeout));
    cli.set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(timeout));
    cli.set_write_timeout(std::chrono::duration_cast<std::chrono::microseconds>(timeout));
    httplib::Headers headers;
    if (!opt.api_key.empty()) headers.emplace("Authorization", "Bearer " + opt.api_key);
    const json body{{"prompt", std::vector<TokenId>(j.prompt.begin(), j.prompt.end() - 1)}};
    const auto t0 = Clock::now();
    const auto res = cli.Post("/v1/kv/prefill", headers, body.dump(), "application/json");
    std::string reason, message;
    if (!res) {
      // A read that fails before the timeout is a connection the prefill server broke off.
      const bool late = res.error() == httplib::Error::ConnectionTimeout ||
                        (res.error() == httplib::Error::Read && Clock::now() - t0 >= timeout);
      reason = transfer::to_string(late ? transfer::FailureReason::kTimeout
                                        : transfer::FailureReason::kPeerFailed);
      message = fmt::format("POST http://{}:{}/v1/kv/prefill: {}", peer_host, control_port,
                            httplib::to_string(res.error()));
    } else if (res->status != 200) {
      reason = transfer::to_string(transfer::FailureReason::kRefused);
      message = fmt::format("the prefill server answered {}: {}", res->status,
                            printable(res->body.substr(0, 300)));
    } else {
      // Read exactly (json_int64): a float or an out-of-range id is no request of ours.
      const json answer = json::parse(res->body, nullptr, false);
      const std::optional<std::int64_t> id = answer.is_object() && answer.contains("kv_request")
                                                 ? json_int64(answer.at("kv_request"))
                                                 : std::nullopt;
      if (id) {
        j.kv_request = *id;
        return;
      }
      reason = transfer::to_string(transfer::FailureReason::kRefused);
      message = "the prefill server's answer has no kv_request";
    }
    metrics.transfer_failure(reason).Increment();
    if (opt.kv.fail_on_load_failure) {
      throw ApiError(503,
                     fmt::format("the remote prefill failed ({}): {}; this server runs with "
                                 "--kv-load-failure fail",
                                 reason, message),
                     "service_unavailable", {}, "kv_transfer_failed");
    }
  }

  // Prefill side: POST /v1/kv/prefill {"prompt": [ids]} computes the prompt, offers its blocks
  // to the decode sides, and answers {"kv_request", "num_tokens"} once they are pinned.
  void prefill_for_peer(const httplib::Request& req, httplib::Response& res) {
    if (!prefill_agent) {
      throw ApiError(404,
                     "this server does not serve remote prefills (start it with --kv-role "
                     "prefill)",
                     "invalid_request_error", {}, "not_found");
    }
    const json body = parse_body(req.body);
    CompletionRequest r = parse_completion(body, limits);
    if (r.prompts.size() != 1 || r.prompts[0].text) {
      throw ApiError(400, "a remote prefill takes one prompt of token ids", "invalid_request_error",
                     "prompt");
    }
    GenerationParams p;
    p.max_tokens = 1;
    p.ignore_eos = true;
    std::vector<std::vector<TokenId>> prompts;
    prompts.push_back(std::move(r.prompts[0].ids));
    const std::vector<JobPtr> jobs = submit(std::move(prompts), p, 1, true);
    std::unique_lock lk(mu);
    jobs_cv.wait(lk, [&] { return jobs[0]->done; });
    if (!jobs[0]->error.empty()) throw ApiError(503, jobs[0]->error, "service_unavailable");
    send_json(res, 200,
              {{"kv_request", jobs[0]->kv_request},
               {"num_tokens", static_cast<std::int64_t>(jobs[0]->prompt.size())}});
  }

  void cancel(const std::vector<JobPtr>& jobs) {
    std::lock_guard lk(mu);
    for (const JobPtr& j : jobs) {
      if (!j->done) j->cancel = true, cancel_pending = true;
    }
    engine_cv.notify_one();
  }

  json usage(std::int64_t prompt, std::int64_t completion) const {
    return {{"prompt_tokens", prompt},
            {"completion_tokens", completion},
            {"total_tokens", prompt + completion}};
  }

  void generate(const httplib::Request& req, httplib::Response& res, bool chat);

  // --kv-role: the agent over the runner's cache tensors, described by the runner's own plan
  // and geometry (what its kernels read). A decode side connects at once, so a peer that holds
  // another model is refused before the server takes requests.
  void start_transfer() {
    runner::ModelRunner& r = *model.runner;
    const transfer::LayoutDescriptor layout =
        transfer::make_descriptor(r.desc(), r.plan(), r.geometry());
    transfer::TensorSpans tensors;
    for (int t = 0; t < r.num_cache_tensors(); ++t) tensors.push_back(r.cache_tensor(t));
    transfer::AgentOptions a = opt.kv.agent;
    if (opt.kv.role == KvRole::kPrefill) {
      a.control = std::to_string(bound_port);  // the HTTP port: /v1/kv/prefill
      prefill_agent = std::make_unique<transfer::PrefillAgent>(
          layout, std::move(tensors), a, opt.kv.host, static_cast<std::uint16_t>(opt.kv.port));
      return;
    }
    const std::size_t colon = opt.kv.peer.rfind(':');
    int port = 0;
    if (colon == std::string::npos ||
        std::from_chars(opt.kv.peer.data() + colon + 1, opt.kv.peer.data() + opt.kv.peer.size(),
                        port)
                .ec != std::errc{} ||
        port < 1 || port > 65535) {
      throw_invalid(fmt::format("--kv-peer '{}' is not HOST:PORT (the prefill server's --kv-port)",
                                opt.kv.peer));
    }
    peer_host = opt.kv.peer.substr(0, colon);
    peer_port = static_cast<std::uint16_t>(port);
    decode_agent = std::make_unique<transfer::DecodeAgent>(layout, std::move(tensors), a);
    decode_agent->connect(peer_host, peer_port);
    const std::string& control = decode_agent->control(0);
    if (std::from_chars(control.data(), control.data() + control.size(), control_port).ec !=
            std::errc{} ||
        control_port < 1) {
      throw_invalid(fmt::format(
          "the KV peer {} is not a `mixkv serve --kv-role prefill` server (it names no HTTP port)",
          opt.kv.peer));
    }
  }
};

void Server::Impl::generate(const httplib::Request& req, httplib::Response& res, bool chat) {
  const json body = parse_body(req.body);
  GenerationParams params;
  std::vector<std::vector<TokenId>> prompts;
  std::int64_t default_max_tokens = 16;  // OpenAI's completions default
  if (chat) {
    ChatRequest r = parse_chat(body, limits);
    params = r.params;
    check_model_name(params);
    if (model.tokenizer == nullptr || model.chat_template == nullptr) {
      throw ApiError(400,
                     fmt::format("{} has no chat template, so /v1/chat/completions cannot render "
                                 "messages; use /v1/completions",
                                 name()),
                     "invalid_request_error", "messages");
    }
    const std::string text = model.chat_template->render(r.messages, true);
    prompts.push_back(tokenize(text, true));
    default_max_tokens = std::numeric_limits<std::int32_t>::max();  // the rest of the context
  } else {
    CompletionRequest r = parse_completion(body, limits);
    params = r.params;
    check_model_name(params);
    for (Prompt& p : r.prompts) {
      prompts.push_back(p.text ? tokenize(*p.text, true) : std::move(p.ids));
    }
  }
  std::vector<JobPtr> jobs = submit(std::move(prompts), params, default_max_tokens);

  const std::string id = fmt::format("{}-{:016x}", chat ? "chatcmpl" : "cmpl", next_id++);
  const std::int64_t created = static_cast<std::int64_t>(std::time(nullptr));
  const std::string object = chat ? "chat.completion" : "text_completion";
  auto texts = std::make_shared<std::vector<ChoiceText>>();
  for (std::size_t i = 0; i < jobs.size(); ++i) texts->emplace_back(model.tokenizer, params.stop);
  const int fd = connection_fd(req);

  // Feeds a job's new tokens to its text; true when the choice is complete.
  auto advance = [](Job& j, ChoiceText& t, std::size_t& consumed) {
    while (consumed < j.tokens.size()) {
      if (!t.push(j.tokens[consumed++])) return true;
    }
    if (t.stopped()) return true;
    if (j.done) t.finish();
    return j.done;
  };

  if (!params.stream) {
    std::vector<std::size_t> consumed(jobs.size(), 0);
    std::vector<bool> complete(jobs.size(), false);
    std::unique_lock lk(mu);
    for (;;) {
      bool all = true;
      for (std::size_t i = 0; i < jobs.size(); ++i) {
        if (!complete[i]) complete[i] = advance(*jobs[i], (*texts)[i], consumed[i]);
        all = all && complete[i];
      }
      if (all) break;
      if (client_gone(fd)) break;
      jobs_cv.wait_for(lk, kPollInterval);
    }
    bool gone = false;
    std::string error;
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      if (!complete[i]) gone = true;
      if (!jobs[i]->error.empty()) error = jobs[i]->error;
    }
    lk.unlock();
    cancel(jobs);  // stop sequences and a client gone: free the blocks now
    if (gone) return;
    if (!error.empty()) throw ApiError(503, error, "service_unavailable");
    json choices = json::array();
    std::int64_t prompt_tokens = 0, completion_tokens = 0;
    for (std::size_t i = 0; i < jobs.size(); ++i) {
      ChoiceText& t = (*texts)[i];
      const std::string text = t.take();
      json c = {{"index", i},
                {"logprobs", nullptr},
                {"finish_reason", t.stopped() ? "stop" : jobs[i]->finish_reason},
                {"token_ids", t.ids()}};
      if (chat) {
        c["message"] = {{"role", "assistant"}, {"content", text}};
      } else {
        c["text"] = text;
      }
      choices.push_back(std::move(c));
      prompt_tokens += static_cast<std::int64_t>(jobs[i]->prompt.size());
      completion_tokens += static_cast<std::int64_t>(t.ids().size());
    }
    send_json(res, 200,
              {{"id", id},
               {"object", object},
               {"created", created},
               {"model", name()},
               {"choices", std::move(choices)},
               {"usage", usage(prompt_tokens, completion_tokens)}});
    return;
  }

  // Streaming: one event per step that gives a choice text, a last event per choice with its
  // finish_reason, the usage when asked, then [DONE].
  struct StreamState {
    std::vector<std::size_t> consumed;
    std::vector<bool> complete, announced;
    bool finished = false;
  };
  auto st = std::make_shared<StreamState>();
  st->consumed.assign(jobs.size(), 0);
  st->complete.assign(jobs.size(), false);
  st->announced.assign(jobs.size(), false);
  const bool include_usage = params.include_usage;
  const std::string chunk_object = chat ? "chat.completion.chunk" : "text_completion";
  {
    std::lock_guard lk(mu);
    ++open_requests;
  }
  auto event = [=, this](std::size_t index, const std::string& text, const json& ids,
                         const json& finish, bool first) {
    json c = {{"index", index}, {"logprobs", nullptr}, {"finish_reason", finish}};
    if (chat) {
      c["delta"] =
          first ? json{{"role", "assistant"}, {"content", text}}
                : (finish.is_null() || !text.empty() ? json{{"content", text}} : json::object());
    } else {
      c["text"] = text;
    }
    c["token_ids"] = ids;
    return sse({{"id", id},
                {"object", chunk_object},
                {"created", created},
                {"model", name()},
                {"choices", json::array({std::move(c)})}});
  };
  res.set_chunked_content_provider(
      "text/event-stream",
      [=, this](std::size_t, httplib::DataSink& sink) {
        std::string out;
        std::string error;
        bool all = true;
        {
          std::unique_lock lk(mu);
          jobs_cv.wait_for(lk, kPollInterval, [&] {
            for (std::size_t i = 0; i < jobs.size(); ++i) {
              if (!st->complete[i] && (jobs[i]->done || jobs[i]->tokens.size() > st->consumed[i])) {
                return true;
              }
            }
            return false;
          });
          for (std::size_t i = 0; i < jobs.size(); ++i) {
            if (st->complete[i]) continue;
            Job& j = *jobs[i];
            ChoiceText& t = (*texts)[i];
            const std::size_t before = t.ids().size();
            const bool complete = advance(j, t, st->consumed[i]);
            const std::string text = t.take();
            const json ids(std::vector<TokenId>(
                t.ids().begin() + static_cast<std::ptrdiff_t>(before), t.ids().end()));
            if (!j.error.empty()) error = j.error;
            const bool first = chat && !st->announced[i];
            if (!text.empty() || first || !ids.empty()) {
              out += event(i, text, ids, nullptr, first);
              st->announced[i] = true;
            }
            if (complete && j.error.empty()) {
              out += event(i, "", json::array(), t.stopped() ? "stop" : j.finish_reason, false);
            }
            if (t.stopped() && !j.done) {
              j.cancel = true;  // a stop sequence: free its blocks now, not at the stream's end
              cancel_pending = true;
              engine_cv.notify_one();
            }
            st->complete[i] = complete;
            all = all && complete;
          }
        }
        if (!error.empty()) {
          out += sse(ApiError(503, error, "service_unavailable").body());
          all = true;
        }
        if (all) {
          if (include_usage && error.empty()) {
            std::int64_t p = 0, c = 0;
            for (std::size_t i = 0; i < jobs.size(); ++i) {
              p += static_cast<std::int64_t>(jobs[i]->prompt.size());
              c += static_cast<std::int64_t>((*texts)[i].ids().size());
            }
            out += sse({{"id", id},
                        {"object", chunk_object},
                        {"created", created},
                        {"model", name()},
                        {"choices", json::array()},
                        {"usage", usage(p, c)}});
          }
          out += "data: [DONE]\n\n";
        }
        if (!out.empty() && !sink.write(out.data(), out.size())) return false;
        if (all) {
          st->finished = true;
          sink.done();
          return true;
        }
        return !client_gone(fd);
      },
      [=, this](bool) {
        cancel(jobs);  // a client gone or a stop sequence: free the blocks now
        std::lock_guard lk(mu);
        --open_requests;
        jobs_cv.notify_all();
      });
}

Server::Server(ServeOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {
  Impl& m = *impl_;
  if (m.opt.max_num_seqs < 1 || m.opt.max_queue < 0 || m.opt.prefill_chunk < 1) {
    throw_invalid(fmt::format(
        "--max-num-seqs ({}) and the prefill chunk ({}) must be positive and --max-queue ({}) "
        "not negative",
        m.opt.max_num_seqs, m.opt.prefill_chunk, m.opt.max_queue));
  }
  if (!(m.opt.shutdown_timeout >= 0)) {
    throw_invalid(fmt::format("--shutdown-timeout {} must be a number of seconds, 0 or more",
                              m.opt.shutdown_timeout));
  }
  const std::size_t threads =
      m.opt.http_threads > 0 ? static_cast<std::size_t>(m.opt.http_threads)
                             : static_cast<std::size_t>(m.opt.max_num_seqs + m.opt.max_queue + 8);
  m.http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  m.http.set_payload_max_length(m.opt.max_body_bytes);
  m.http.set_keep_alive_timeout(2);
  m.http.set_tcp_nodelay(true);

  m.http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    Impl& s = *impl_;
    const bool api =
        req.path.rfind("/v1/", 0) == 0 || req.path == "/tokenize" || req.path == "/detokenize";
    if (api && !s.opt.api_key.empty() &&
        req.get_header_value("Authorization") != "Bearer " + s.opt.api_key) {
      send_json(res, 401,
                error_body(401, "a missing or wrong API key: send 'Authorization: Bearer KEY'",
                           "invalid_request_error", {}, "invalid_api_key"));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (api && !s.ready) {
      res.set_header("Retry-After", "1");
      send_json(res, 503, error_body(503, "the model is still loading", "service_unavailable"));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // cpp-httplib's own refusals (no route: 404, body over the limit: 413, bad request line: 400)
  // come without a body: give them OpenAI's error shape.
  m.http.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        std::string message =
            res.status == 404   ? fmt::format("no route {} {}", req.method, printable(req.path))
            : res.status == 413 ? "the request body is larger than the server accepts"
                                : fmt::format("HTTP {}", res.status);
        send_json(res, res.status,
                  error_body(res.status, message, "invalid_request_error", {},
                             res.status == 413 ? "request_too_large" : ""));
        return httplib::Server::HandlerResponse::Handled;
      }));
  m.http.set_exception_handler([](const httplib::Request&, httplib::Response& res,
                                  std::exception_ptr ep) {
    try {
      std::rethrow_exception(ep);
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const Error& e) {
      const int status = e.code() == ErrorCode::kInternal ? 500 : 400;
      send_json(
          res, status,
          error_body(status, e.what(), status == 500 ? "internal_error" : "invalid_request_error"));
    } catch (const std::exception& e) {
      send_json(res, 500, error_body(500, e.what(), "internal_error"));
    }
  });

  m.http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (!impl_->ready || impl_->draining) {
      res.status = 503;
      res.set_content(impl_->ready ? "draining\n" : "loading\n", "text/plain");
    } else {
      res.status = 200;
    }
  });
  m.http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(impl_->metrics.text(), "text/plain; version=0.0.4");
  });
  m.http.Get("/openapi.json", [this](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, openapi_document(impl_->limits, impl_->name()));
  });
  m.http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200,
              {{"object", "list"},
               {"data", json::array({{{"id", impl_->name()},
                                      {"object", "model"},
                                      {"created", 0},
                                      {"owned_by", "mixkv"},
                                      {"max_model_len", impl_->max_model_len}}})}});
  });
  m.http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    impl_->generate(req, res, false);
  });
  m.http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    impl_->generate(req, res, true);
  });
  m.http.Post("/v1/kv/prefill", [this](const httplib::Request& req, httplib::Response& res) {
    impl_->prefill_for_peer(req, res);
  });
  m.http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    Impl& s = *impl_;
    const TokenizeRequest r = parse_tokenize(parse_body(req.body));
    const std::vector<TokenId> ids = s.tokenize(r.prompt, r.add_special_tokens);
    send_json(res, 200,
              {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", s.max_model_len}});
  });
  m.http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    Impl& s = *impl_;
    const std::vector<TokenId> ids = parse_detokenize(parse_body(req.body), s.limits);
    if (s.model.tokenizer == nullptr) {
      throw ApiError(400, fmt::format("{} has no tokenizer to detokenize with", s.name()));
    }
    send_json(res, 200, {{"prompt", s.model.tokenizer->decode(ids)}});
  });
}

Server::~Server() { shutdown(); }

void Server::start() {
  Impl& m = *impl_;
  if (m.opt.port == 0) {
    m.bound_port = m.http.bind_to_any_port(m.opt.host);
  } else {
    m.bound_port = m.http.bind_to_port(m.opt.host, m.opt.port) ? m.opt.port : -1;
  }
  if (m.bound_port <= 0) {
    throw_invalid(
        fmt::format("cannot listen on {}:{}; is another server using the port? Give "
                    "another --port or --host",
                    m.opt.host, m.opt.port));
  }
  m.http.widen_backlog(1024);
  m.listener = std::thread([&m] {
    m.http.listen_after_bind();
    m.listener_done = true;
  });
}

int Server::port() const { return impl_->bound_port; }

int Server::kv_port() const { return impl_->prefill_agent ? impl_->prefill_agent->port() : 0; }

void Server::attach(const ServedModel& served) {
  Impl& m = *impl_;
  if (served.runner == nullptr) throw_internal("Server::attach without a runner");
  m.model = served;
  m.k = served.drafter != nullptr ? served.num_spec_tokens : 0;
  const plan::CachePlan& plan = served.runner->plan();
  m.max_model_len =
      std::min(plan.max_model_len, plan.max_model_len_that_fits > 0 ? plan.max_model_len_that_fits
                                                                    : plan.max_model_len);
  m.limits.vocab_size = served.runner->vocab_size();
  m.metrics.add_groups(plan);
  m.runner_model = std::make_unique<engine::RunnerModel>(*served.runner, m.k > 0);
  if (m.opt.kv.role != KvRole::kNone) m.start_transfer();
  m.manager = std::make_unique<cache::KvCacheManager>(
      plan, m.k, cache::ManagerOptions{m.opt.prefix_caching, 0, 0});
  m.new_scheduler();
  {
    std::lock_guard lk(m.mu);
    m.export_counters();
  }
  if (m.decode_agent) m.pull_thread = std::thread([&m] { m.pull_loop(); });
  m.engine_thread = std::thread([&m] { m.engine_loop(); });
  m.ready = true;
}

bool Server::shutdown() {
  Impl& m = *impl_;
  if (m.stopped.exchange(true)) return true;
  m.draining = true;
  bool drained = true;
  {
    std::unique_lock lk(m.mu);
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(m.opt.shutdown_timeout));
    drained = m.jobs_cv.wait_until(
        lk, deadline, [&] { return m.active.empty() && m.inbox.empty() && m.open_requests == 0; });
    m.stop_engine = true;
    m.engine_cv.notify_one();
  }
  if (m.engine_thread.joinable()) m.engine_thread.join();
  if (m.pull_thread.joinable()) {
    {
      std::lock_guard lk(m.mu);
      m.stop_pulls = true;
      m.pull_cv.notify_all();
    }
    m.pull_thread.join();
  }
  {
    // Streams of cancelled jobs send their error event and close.
    std::unique_lock lk(m.mu);
    m.jobs_cv.wait_for(lk, std::chrono::seconds(2), [&] { return m.open_requests == 0; });
  }
  // cpp-httplib's stop() does nothing until listen_after_bind() has marked the server running, so
  // a stop that came first would leave the listener accepting forever (seen in a test that shut a
  // server down at once): wait for the listener to run (or to have returned), then stop it.
  while (m.listener.joinable() && !m.listener_done && !m.http.is_running()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  m.http.stop();
  if (m.listener.joinable()) m.listener.join();
  return drained;
}

std::string Server::metrics_text() const { return impl_->metrics.text(); }

}  // namespace mixkv::server
