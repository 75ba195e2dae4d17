#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <istream>
#include <limits>
#include <random>
#include <span>

#include "mixkv/core/error.hpp"
#include "mixkv/core/read_file.hpp"
#include "mixkv/engine/simulate.hpp"
#include "mixkv/sched/scheduler.hpp"
#include "mixkv/spec/drafter.hpp"

namespace mixkv::sim {
namespace {

using cache::RequestId;
using cache::TokenId;
using Clock = std::chrono::steady_clock;

std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Token streams: a shared prefix's, a request's own prompt suffix, a request's outputs. Distinct
// domains so streams never share blocks by accident.
constexpr TokenId kStreamVocab = 150000;
TokenId stream_token(std::uint64_t domain, std::uint64_t key, std::int64_t position) {
  const std::uint64_t h =
      splitmix(splitmix(domain * 0x100000001B3ULL ^ key) ^ static_cast<std::uint64_t>(position));
  return static_cast<TokenId>(1 + h % kStreamVocab);
}
constexpr std::uint64_t kPrefixDomain = 1, kPromptDomain = 2, kOutputDomain = 3;

std::vector<TokenId> prompt_tokens(const TraceRequest& r, std::size_t index) {
  if (!r.tokens.empty()) return r.tokens;
  std::vector<TokenId> t(static_cast<std::size_t>(r.prompt_len));
  const std::int64_t shared =
      r.prefix_id ? std::min(r.prefix_len.value_or(r.prompt_len), r.prompt_len) : 0;
  for (std::int64_t i = 0; i < r.prompt_len; ++i) {
    t[static_cast<std::size_t>(i)] =
        i < shared ? stream_token(kPrefixDomain, static_cast<std::uint64_t>(*r.prefix_id), i)
                   : stream_token(kPromptDomain, index, i);
  }
  return t;
}

std::int64_t int_field(const nlohmann::json& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end()) throw_invalid(fmt::format("{}: missing \"{}\"", where, key));
  // nlohmann reads 2^63 to 2^64 - 1 as unsigned (and larger ones as floats): no int64 holds it.
  if (it->is_number_unsigned() &&
      it->get<std::uint64_t>() >
          static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    throw_invalid(fmt::format("{}: \"{}\" is {}, far above the limits of a trace (docs/cache.md)",
                              where, key, it->dump()));
  }
  if (!it->is_number_integer()) {
    throw_invalid(fmt::format("{}: \"{}\" must be an integer, got {}", where, key, it->dump()));
  }
  return it->get<std::int64_t>();
}

void check_field(const std::string& where, std::string_view key, std::int64_t value,
                 std::int64_t minimum, std::int64_t maximum, std::string_view unit) {
  if (value < minimum) {
    throw_invalid(fmt::format("{}: \"{}\" is {}, expected >= {}", where, key, value, minimum));
  }
  if (value > maximum) {
    throw_invalid(fmt::format("{}: \"{}\" is {}, above the limit of {} {} (docs/cache.md)", where,
                              key, value, maximum, unit));
  }
}

TraceRequest parse_line(std::string_view text, const std::string& where) {
  if (text.size() > static_cast<std::size_t>(kMaxTraceLineBytes)) {
    throw_invalid(fmt::format("{}: the line is {} bytes, above the limit of {} bytes per request",
                              where, text.size(), kMaxTraceLineBytes));
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw_invalid(fmt::format("{}: not JSON: {}", where, e.what()));
  }
  if (!j.is_object()) throw_invalid(fmt::format("{}: expected a JSON object per line", where));
  TraceRequest r;
  r.source = where;
  r.arrival_step = int_field(j, "arrival_step", where);
  r.output_len = int_field(j, "output_len", where);
  const bool has_len = j.contains("prompt_len"), has_prompt = j.contains("prompt");
  if (has_len == has_prompt) {
    throw_invalid(fmt::format("{}: give exactly one of \"prompt_len\" and \"prompt\"", where));
  }
  if (has_len) {
    r.prompt_len = int_field(j, "prompt_len", where);
  } else {
    const auto& p = j["prompt"];
    if (!p.is_array() || p.empty()) {
      throw_invalid(fmt::format("{}: \"prompt\" must be a non-empty array of token ids", where));
    }
    for (const auto& t : p) {
      if (!t.is_number_integer() || t.get<std::int64_t>() < 0 ||
          t.get<std::int64_t>() > std::numeric_limits<TokenId>::max()) {
        throw_invalid(fmt::format("{}: \"prompt\" holds {}, expected token ids (integers >= 0)",
                                  where, t.dump()));
      }
      r.tokens.push_back(t.get<TokenId>());
    }
  }
  if (const auto it = j.find("prefix_id"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer()) {
      throw_invalid(
          fmt::format("{}: \"prefix_id\" must be an integer or null, got {}", where, it->dump()));
    }
    r.prefix_id = it->get<std::int64_t>();
  }
  if (j.contains("prefix_len")) {
    r.prefix_len = int_field(j, "prefix_len", where);
    if (!r.prefix_id) throw_invalid(fmt::format("{}: \"prefix_len\" needs a \"prefix_id\"", where));
  }
  if (has_prompt && r.prefix_id) {
    throw_invalid(
        fmt::format("{}: \"prefix_id\" applies to \"prompt_len\", not \"prompt\"", where));
  }
  check_request(r);
  return r;
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

void check_request(const TraceRequest& r) {
  const std::string& where = r.source;
  check_field(where, "arrival_step", r.arrival_step, 0, kMaxTraceArrivalStep, "steps");
  check_field(where, "output_len", r.output_len, 1, kMaxTraceRequestTokens, "tokens");
  if (r.tokens.empty()) {
    check_field(where, "prompt_len", r.prompt_len, 1, kMaxTraceRequestTokens, "tokens");
  } else {
    check_field(where, "prompt", static_cast<std::int64_t>(r.tokens.size()), 1,
                kMaxTraceRequestTokens, "tokens");
  }
  if (r.prefix_len) {
    check_field(where, "prefix_len", *r.prefix_len, 0, kMaxTraceRequestTokens, "tokens");
  }
}

std::vector<TraceRequest> parse_trace(std::string_view text, std::string_view name) {
  std::vector<TraceRequest> out;
  std::size_t at = 0;
  for (std::int64_t n = 1; at < text.size(); ++n) {
    std::size_t end = text.find('\n', at);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(at, end - at);
    at = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    if (static_cast<std::int64_t>(out.size()) == kMaxTraceRequests) {
      throw_invalid(
          fmt::format("{}:{}: the trace holds more than {} requests, the limit of a trace "
                      "(docs/cache.md); split it",
                      name, n, kMaxTraceRequests));
    }
    out.push_back(parse_line(line, fmt::format("{}:{}", name, n)));
  }
  if (out.empty()) throw_invalid(fmt::format("{}: the trace holds no requests", name));
  std::stable_sort(out.begin(), out.end(), [](const TraceRequest& a, const TraceRequest& b) {
    return a.arrival_step < b.arrival_step;
  });
  return out;
}

std::vector<TraceRequest> parse_trace(std::istream& in, std::string_view name) {
  std::string text;
  char chunk[1 << 16];
  while (in.read(chunk, sizeof chunk) || in.gcount() > 0) {
    text.append(chunk, static_cast<std::size_t>(in.gcount()));
    if (static_cast<std::int64_t>(text.size()) > kMaxTraceFileBytes) {
      throw_invalid(fmt::format("{}: the trace is more than {} bytes, the limit of a trace", name,
                                kMaxTraceFileBytes));
    }
  }
  return parse_trace(std::string_view(text), name);
}

std::vector<TraceRequest> read_trace(const std::string& path) {
  return parse_trace(std::string_view(read_regular_file(path, kMaxTraceFileBytes, "trace file")),
                     path);
}

std::vector<TraceRequest> synthetic_trace(const SyntheticOptions& options) {
  if (options.requests < 1 || options.requests > kMaxTraceRequests) {
    throw_invalid(
        fmt::format("--requests is {}, expected 1 to {}", options.requests, kMaxTraceRequests));
  }
  std::mt19937_64 rng(options.seed);
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  constexpr std::int64_t kPrefixLens[] = {1024, 512, 2048, 256};
  std::exponential_distribution<double> gap(2.0);  // about two arrivals per step
  double clock = 0;
  std::vector<TraceRequest> out;
  for (std::int64_t i = 0; i < options.requests; ++i) {
    TraceRequest r;
    r.source = fmt::format("synthetic #{}", i);
    r.arrival_step = static_cast<std::int64_t>(clock);
    clock += gap(rng);
    std::int64_t prefix = 0;
    if (pick(0, 9) < 7) {
      r.prefix_id = pick(0, 3);
      prefix = kPrefixLens[*r.prefix_id];
      r.prefix_len = prefix;
    }
    r.prompt_len = prefix + pick(16, 768);
    r.output_len = pick(16, 384);
    if (options.max_len > 0) {
      // Keep prompt + output + look-ahead within max_len: shrink the prompt, then the output.
      const std::int64_t room = options.max_len - options.num_spec_tokens - 1;
      r.output_len = std::max<std::int64_t>(1, std::min(r.output_len, room / 4));
      r.prompt_len = std::max<std::int64_t>(1, std::min(r.prompt_len, room - r.output_len));
    }
    out.push_back(std::move(r));
  }
  return out;
}

namespace {

// The simulator's stand-ins for a drafter and a model: a draft for position p of request i is
// the output stream's token there, and the "target" accepts each draft with probability
// `acceptance` until the first rejection, where it picks another token. The scheduler, the
// manager and every count are the ones `generate` uses; only the tokens are made up.
class StreamDrafter final : public spec::Drafter {
 public:
  std::string name() const override { return "simulated"; }
  std::vector<TokenId> propose(const spec::DraftContext& ctx, int k) override {
    std::vector<TokenId> out;
    for (int t = 0; t < k; ++t) {
      out.push_back(stream_token(kOutputDomain, ctx.request, ctx.num_computed + 1 + t));
    }
    return out;
  }
};

class BernoulliModel final : public sched::Model {
 public:
  BernoulliModel(double acceptance, std::uint64_t seed)
      : rng_(seed ^ 0xACCE97ULL), accept_(acceptance) {}

  sched::ModelOutput forward(std::span<const sched::Work> batch) override {
    sched::ModelOutput out;
    for (const sched::Work& w : batch) {
      const auto n = static_cast<std::int64_t>(w.tokens.size());
      if (w.prefill) {
        out.picks.insert(out.picks.end(), static_cast<std::size_t>(n - 1), 0);
        out.picks.push_back(stream_token(kOutputDomain, w.request, w.start + n));
        continue;
      }
      // Row i verifies draft i + 1: accepted with probability P until the first rejection,
      // which picks a token other than the draft; after every draft, the bonus.
      bool accepting = true;
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t position = w.start + i + 1;
        if (i + 1 < n && accepting && accept_(rng_)) {
          out.picks.push_back(w.tokens[static_cast<std::size_t>(i + 1)]);
          continue;
        }
        const TokenId draft = i + 1 < n ? w.tokens[static_cast<std::size_t>(i + 1)] : 0;
        const TokenId fresh = stream_token(kOutputDomain, w.request, position);
        out.picks.push_back(accepting && i + 1 < n ? draft % kStreamVocab + 1 : fresh);
        accepting = false;
      }
    }
    return out;
  }
  std::int64_t vocab_size() const override { return kStreamVocab + 1; }

 private:
  std::mt19937_64 rng_;
  std::bernoulli_distribution accept_;
};

}  // namespace

SimReport simulate(cache::KvCacheManager& manager, const plan::CachePlan& plan, int num_spec_tokens,
                   const std::vector<TraceRequest>& trace, const SimOptions& options) {
  if (!(options.acceptance >= 0 && options.acceptance <= 1)) {
    throw_invalid(fmt::format("--acceptance is {}, expected 0 to 1", options.acceptance));
  }
  if (options.max_batch < 1) {
    throw_invalid(fmt::format("--max-batch is {}, expected >= 1", options.max_batch));
  }
  const int k = num_spec_tokens;
  const std::int64_t max_len = plan.max_model_len;
  for (std::size_t i = 1; i < trace.size(); ++i) {
    if (trace[i].arrival_step < trace[i - 1].arrival_step) {
      throw_invalid(fmt::format("{}: arrivals must not decrease", trace[i].source));
    }
  }
  if (k < 0 || k > model::kMaxSpecTokens) {
    throw_invalid(fmt::format("num_spec_tokens is {}, expected 0 to {}", k, model::kMaxSpecTokens));
  }
  if (static_cast<std::int64_t>(trace.size()) > kMaxTraceRequests) {
    throw_invalid(fmt::format("the trace holds {} requests, above the limit of {}", trace.size(),
                              kMaxTraceRequests));
  }
  // Within check_request's limits no sum below can overflow: 10^6 requests of < 2^32 tokens each.
  std::int64_t tokens = 0;
  for (const auto& t : trace) {
    check_request(t);
    const std::int64_t need = t.length() + t.output_len + k + 1;
    if (max_len > 0 && need > max_len) {
      throw_invalid(
          fmt::format("{}: prompt {} + output {} + {} look-ahead tokens exceed max_model_len {}",
                      t.source, t.length(), t.output_len, k + 1, max_len));
    }
    tokens += need;
  }
  // Every request's tokens are held for the whole run (a preempted one is recomputed from them).
  const std::int64_t token_bytes = tokens * static_cast<std::int64_t>(sizeof(TokenId));
  if (token_bytes > kMaxSimulationTokenBytes) {
    throw_invalid(fmt::format(
        "the trace's {} requests hold {} tokens (prompts, outputs and look-ahead), which need {} "
        "bytes of token ids, above the simulator's limit of {} bytes (1 GiB); use fewer or "
        "shorter requests",
        trace.size(), tokens, token_bytes, kMaxSimulationTokenBytes));
  }

  // Whole prompts in one step, k drafts every step (a server does not know where a request
  // stops).
  sched::SchedulerOptions so;
  so.num_spec_tokens = k;
  so.max_batch = options.max_batch;
  so.prefill_chunk = 0;
  so.cap_drafts = false;
  so.adaptive_draft = false;  // the trace's acceptance, not the machine's timings, decides
  sched::Scheduler scheduler(manager, plan, so);
  StreamDrafter drafter;
  BernoulliModel model(options.acceptance, options.seed);

  SimReport rep;
  rep.requests = static_cast<std::int64_t>(trace.size());
  rep.num_spec_tokens = k;
  rep.acceptance = options.acceptance;
  rep.pool_blocks = manager.pool().num_blocks();
  auto sample = [&](std::int64_t step) {
    UsageSample s;
    s.step = step;
    s.running = static_cast<std::int64_t>(scheduler.num_running());
    s.waiting = static_cast<std::int64_t>(scheduler.num_waiting());
    s.blocks_used = manager.pool().num_used();
    for (const auto& g : manager.stats()) s.blocks_held.push_back(g.blocks_held);
    rep.usage.push_back(std::move(s));
  };
  const auto finished = [&] { return static_cast<std::int64_t>(scheduler.num_finished()); };

  const auto start = Clock::now();
  std::size_t next = 0;
  std::int64_t step = 0;
  while (finished() < rep.requests) {
    for (; next < trace.size() && trace[next].arrival_step <= step; ++next) {
      scheduler.add({prompt_tokens(trace[next], next), trace[next].output_len, trace[next].source});
    }
    if (scheduler.idle()) {
      step = trace[next].arrival_step;  // idle until the next arrival
      continue;
    }
    scheduler.step(model, &drafter);
    if (options.sample_every > 0 && step % options.sample_every == 0) sample(step);
    if (options.progress && step % 16 == 0) options.progress(finished(), rep.requests);
    ++step;
  }
  rep.steps = step;
  sample(step);
  if (options.progress) options.progress(finished(), rep.requests);
  const sched::Counters& c = scheduler.counters();
  rep.requests_finished = finished();
  rep.request_steps = c.request_steps;
  rep.decode_steps = c.decode_steps;
  rep.preemptions = c.preemptions;
  rep.peak_concurrency = c.peak_running;
  rep.prompt_tokens = c.prompt_tokens;
  rep.hit_tokens = c.hit_tokens;
  rep.generated_tokens = c.generated_tokens;
  rep.wall_seconds = seconds(Clock::now() - start);
  rep.manager_seconds = c.manager_seconds;
  if (rep.manager_seconds > 0) {
    rep.request_steps_per_second = static_cast<double>(rep.request_steps) / rep.manager_seconds;
  }
  if (rep.request_steps > 0) {
    rep.ns_per_request_step = rep.manager_seconds * 1e9 / static_cast<double>(rep.request_steps);
  }
  if (rep.prompt_tokens > 0) {
    rep.prefix_hit_rate =
        static_cast<double>(rep.hit_tokens) / static_cast<double>(rep.prompt_tokens);
  }
  if (rep.decode_steps > 0) {
    rep.mean_accepted_length =
        static_cast<double>(c.decode_tokens) / static_cast<double>(rep.decode_steps);
  }

  // Per-group usage over the samples, then thin the series.
  const auto stats = manager.stats();
  for (std::size_t g = 0; g < stats.size(); ++g) {
    GroupUsage u;
    u.group = stats[g].group;
    u.behaviour = stats[g].behaviour;
    for (const auto& pg : plan.groups) {
      if (pg.id == u.group) u.block_size = pg.block_size;
    }
    // A recurrent group's hits come in snapshot intervals, not in its one-state "block".
    if (u.behaviour == plan::Behaviour::kRecurrent && manager.snapshot_interval() > 0)
      u.block_size = manager.snapshot_interval();
    u.hit_tokens = stats[g].hit_tokens;
    u.evictions = stats[g].evictions;
    double sum = 0;
    for (const auto& s : rep.usage) {
      u.peak_blocks_held = std::max(u.peak_blocks_held, s.blocks_held[g]);
      sum += static_cast<double>(s.blocks_held[g]);
    }
    u.mean_blocks_held = rep.usage.empty() ? 0 : sum / static_cast<double>(rep.usage.size());
    rep.groups.push_back(u);
  }
  if (options.max_samples > 0 &&
      static_cast<std::int64_t>(rep.usage.size()) > options.max_samples) {
    const std::size_t stride =
        (rep.usage.size() + static_cast<std::size_t>(options.max_samples) - 1) /
        static_cast<std::size_t>(options.max_samples);
    std::vector<UsageSample> thinned;
    for (std::size_t i = 0; i < rep.usage.size(); i += stride) thinned.push_back(rep.usage[i]);
    if ((rep.usage.size() - 1) % stride != 0) thinned.push_back(rep.usage.back());
    rep.usage = std::move(thinned);
  }
  rep.invariants = manager.check_invariants();
  return rep;
}

SimReport simulate(const plan::CachePlan& plan, int num_spec_tokens,
                   const std::vector<TraceRequest>& trace, const SimOptions& options) {
  cache::KvCacheManager manager(plan, num_spec_tokens);
  return simulate(manager, plan, num_spec_tokens, trace, options);
}

nlohmann::json to_json(const SimReport& r) {
  nlohmann::json groups = nlohmann::json::array();
  for (const auto& g : r.groups) {
    groups.push_back({{"group", g.group},
                      {"behaviour", plan::to_string(g.behaviour)},
                      {"block_size", g.block_size},
                      {"peak_blocks_held", g.peak_blocks_held},
                      {"mean_blocks_held", g.mean_blocks_held},
                      {"hit_tokens", g.hit_tokens},
                      {"evictions", g.evictions}});
  }
  nlohmann::json usage = nlohmann::json::array();
  for (const auto& s : r.usage) {
    usage.push_back({{"step", s.step},
                     {"running", s.running},
                     {"waiting", s.waiting},
                     {"blocks_used", s.blocks_used},
                     {"blocks_held", s.blocks_held}});
  }
  return {{"requests", r.requests},
          {"requests_finished", r.requests_finished},
          {"steps", r.steps},
          {"request_steps", r.request_steps},
          {"decode_steps", r.decode_steps},
          {"preemptions", r.preemptions},
          {"peak_concurrency", r.peak_concurrency},
          {"prompt_tokens", r.prompt_tokens},
          {"hit_tokens", r.hit_tokens},
          {"generated_tokens", r.generated_tokens},
          {"prefix_hit_rate", r.prefix_hit_rate},
          {"mean_accepted_length", r.mean_accepted_length},
          {"num_spec_tokens", r.num_spec_tokens},
          {"acceptance", r.acceptance},
          {"wall_seconds", r.wall_seconds},
          {"manager_seconds", r.manager_seconds},
          {"request_steps_per_second", r.request_steps_per_second},
          {"ns_per_request_step", r.ns_per_request_step},
          {"pool_blocks", r.pool_blocks},
          {"groups", groups},
          {"usage", usage},
          {"invariants", r.invariants}};
}

std::string to_csv(const SimReport& r) {
  std::string s = "step,running,waiting,blocks_used,group,behaviour,block_size,blocks_held\n";
  for (const auto& u : r.usage) {
    for (std::size_t g = 0; g < r.groups.size() && g < u.blocks_held.size(); ++g) {
      s += fmt::format("{},{},{},{},{},{},{},{}\n", u.step, u.running, u.waiting, u.blocks_used,
                       r.groups[g].group, plan::to_string(r.groups[g].behaviour),
                       r.groups[g].block_size, u.blocks_held[g]);
    }
  }
  return s;
}

}  // namespace mixkv::sim
