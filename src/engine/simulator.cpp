#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <fstream>
#include <istream>
#include <limits>
#include <random>
#include <span>

#include "mixkv/core/error.hpp"
#include "mixkv/engine/simulate.hpp"

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
TokenId stream_token(std::uint64_t domain, std::uint64_t key, std::int64_t position) {
  const std::uint64_t h =
      splitmix(splitmix(domain * 0x100000001B3ULL ^ key) ^ static_cast<std::uint64_t>(position));
  return static_cast<TokenId>(1 + h % 150000);
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

std::int64_t int_field(const nlohmann::json& j, const char* key, const std::string& where,
                       std::int64_t minimum) {
  const auto it = j.find(key);
  if (it == j.end()) throw_invalid(fmt::format("{}: missing \"{}\"", where, key));
  if (!it->is_number_integer()) {
    throw_invalid(fmt::format("{}: \"{}\" must be an integer, got {}", where, key, it->dump()));
  }
  const auto v = it->get<std::int64_t>();
  if (v < minimum) {
    throw_invalid(fmt::format("{}: \"{}\" is {}, expected >= {}", where, key, v, minimum));
  }
  return v;
}

TraceRequest parse_line(const std::string& text, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw_invalid(fmt::format("{}: not JSON: {}", where, e.what()));
  }
  if (!j.is_object()) throw_invalid(fmt::format("{}: expected a JSON object per line", where));
  TraceRequest r;
  r.source = where;
  r.arrival_step = int_field(j, "arrival_step", where, 0);
  r.output_len = int_field(j, "output_len", where, 1);
  const bool has_len = j.contains("prompt_len"), has_prompt = j.contains("prompt");
  if (has_len == has_prompt) {
    throw_invalid(fmt::format("{}: give exactly one of \"prompt_len\" and \"prompt\"", where));
  }
  if (has_len) {
    r.prompt_len = int_field(j, "prompt_len", where, 1);
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
    r.prefix_len = int_field(j, "prefix_len", where, 0);
    if (!r.prefix_id) throw_invalid(fmt::format("{}: \"prefix_len\" needs a \"prefix_id\"", where));
  }
  if (has_prompt && r.prefix_id) {
    throw_invalid(
        fmt::format("{}: \"prefix_id\" applies to \"prompt_len\", not \"prompt\"", where));
  }
  return r;
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

std::vector<TraceRequest> parse_trace(std::istream& in, std::string_view name) {
  std::vector<TraceRequest> out;
  std::string line;
  for (std::int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    out.push_back(parse_line(line, fmt::format("{}:{}", name, n)));
  }
  if (out.empty()) throw_invalid(fmt::format("{}: the trace holds no requests", name));
  std::stable_sort(out.begin(), out.end(), [](const TraceRequest& a, const TraceRequest& b) {
    return a.arrival_step < b.arrival_step;
  });
  return out;
}

std::vector<TraceRequest> read_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw_invalid(fmt::format("{}: cannot open the trace file", path));
  return parse_trace(in, path);
}

std::vector<TraceRequest> synthetic_trace(const SyntheticOptions& options) {
  if (options.requests < 1) {
    throw_invalid(fmt::format("--requests is {}, expected >= 1", options.requests));
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
  for (const auto& t : trace) {
    const std::int64_t need = t.length() + t.output_len + k + 1;
    if (max_len > 0 && need > max_len) {
      throw_invalid(
          fmt::format("{}: prompt {} + output {} + {} look-ahead tokens exceed max_model_len {}",
                      t.source, t.length(), t.output_len, k + 1, max_len));
    }
  }

  struct Req {
    std::vector<TokenId> tokens;  // verified: prompt, then outputs
    std::int64_t generated = 0;
    std::int64_t output_len = 0;
  };
  std::vector<Req> reqs(trace.size());
  for (std::size_t i = 0; i < trace.size(); ++i) {
    reqs[i].tokens = prompt_tokens(trace[i], i);
    reqs[i].output_len = trace[i].output_len;
  }
  auto output_token = [](std::size_t index, std::int64_t position) {
    return stream_token(kOutputDomain, index, position);
  };

  SimReport rep;
  rep.requests = static_cast<std::int64_t>(trace.size());
  rep.num_spec_tokens = k;
  rep.acceptance = options.acceptance;
  rep.pool_blocks = manager.pool().num_blocks();
  std::mt19937_64 rng(options.seed ^ 0xACCE97ULL);
  std::bernoulli_distribution accept(options.acceptance);

  std::deque<std::size_t> waiting;
  std::vector<std::size_t> running;   // in admission order: the back is the newest
  std::vector<std::size_t> admitted;  // prefilled this step: they decode from the next one
  std::vector<int> accepted;
  std::vector<TokenId> step_tokens;
  Clock::duration in_manager{};
  std::int64_t accepted_total = 0;
  std::size_t next = 0;
  const auto start = Clock::now();

  auto sample = [&](std::int64_t step) {
    UsageSample s;
    s.step = step;
    s.running = static_cast<std::int64_t>(running.size());
    s.waiting = static_cast<std::int64_t>(waiting.size());
    s.blocks_used = manager.pool().num_used();
    for (const auto& g : manager.stats()) s.blocks_held.push_back(g.blocks_held);
    rep.usage.push_back(std::move(s));
  };
  auto finish = [&](std::size_t index) {
    const auto t0 = Clock::now();
    manager.free(RequestId{static_cast<std::int64_t>(index)});
    in_manager += Clock::now() - t0;
    ++rep.requests_finished;
  };

  std::int64_t step = 0;
  while (rep.requests_finished < rep.requests) {
    while (next < trace.size() && trace[next].arrival_step <= step) waiting.push_back(next++);
    if (running.empty() && waiting.empty()) {
      step = trace[next].arrival_step;  // idle until the next arrival
      continue;
    }

    // Admission, FIFO: prefill the whole prompt (or everything verified, after a preemption).
    admitted.clear();
    while (!waiting.empty() &&
           static_cast<std::int64_t>(running.size() + admitted.size()) < options.max_batch) {
      const std::size_t index = waiting.front();
      Req& r = reqs[index];
      const RequestId id{static_cast<std::int64_t>(index)};
      const TokenId first = output_token(index, r.generated);
      auto t0 = Clock::now();
      manager.add_request(id, r.tokens);
      const auto hit = manager.admit(id, k);
      if (!hit) manager.free(id);
      in_manager += Clock::now() - t0;
      if (!hit) {
        if (running.empty() && admitted.empty()) {
          throw_invalid(fmt::format(
              "{}: {} tokens plus {} look-ahead do not fit the KV cache even alone ({} blocks); "
              "give more memory",
              trace[index].source, r.tokens.size(), k, rep.pool_blocks));
        }
        break;
      }
      t0 = Clock::now();
      manager.commit(id, static_cast<std::int64_t>(r.tokens.size()) - *hit,
                     std::span<const TokenId>(&first, 1));
      in_manager += Clock::now() - t0;
      rep.prompt_tokens += static_cast<std::int64_t>(r.tokens.size());
      rep.hit_tokens += *hit;
      r.tokens.push_back(first);
      ++r.generated;
      ++rep.generated_tokens;
      ++rep.request_steps;
      waiting.pop_front();
      if (r.generated >= r.output_len) {
        finish(index);
      } else {
        admitted.push_back(index);
      }
    }
    rep.peak_concurrency =
        std::max(rep.peak_concurrency, static_cast<std::int64_t>(running.size() + admitted.size()));

    // Allocation: one token + K look-ahead each; on failure preempt the newest by recompute.
    auto t0 = Clock::now();
    for (std::size_t i = 0; i < running.size();) {
      if (manager.allocate(RequestId{static_cast<std::int64_t>(running[i])}, 1, k)) {
        ++i;
        continue;
      }
      const std::size_t victim = running.back();
      manager.free(RequestId{static_cast<std::int64_t>(victim)});
      running.pop_back();
      waiting.push_front(victim);
      ++rep.preemptions;
    }
    in_manager += Clock::now() - t0;

    // Verification: each draft accepted with probability P until the first rejection.
    accepted.clear();
    step_tokens.clear();
    for (const std::size_t index : running) {
      int a = 0;
      while (a < k && accept(rng)) ++a;
      accepted.push_back(a);
      for (int t = 0; t <= a; ++t) {
        step_tokens.push_back(output_token(index, reqs[index].generated + t));
      }
    }
    t0 = Clock::now();
    std::size_t offset = 0;
    for (std::size_t i = 0; i < running.size(); ++i) {
      const auto n = static_cast<std::size_t>(accepted[i] + 1);
      manager.commit(RequestId{static_cast<std::int64_t>(running[i])}, static_cast<std::int64_t>(n),
                     std::span<const TokenId>(step_tokens.data() + offset, n), accepted[i]);
      offset += n;
    }
    in_manager += Clock::now() - t0;
    offset = 0;
    std::size_t kept = 0;
    for (std::size_t i = 0; i < running.size(); ++i) {
      const std::size_t index = running[i];
      Req& r = reqs[index];
      const auto n = static_cast<std::size_t>(accepted[i] + 1);
      r.tokens.insert(r.tokens.end(), step_tokens.begin() + static_cast<std::ptrdiff_t>(offset),
                      step_tokens.begin() + static_cast<std::ptrdiff_t>(offset + n));
      offset += n;
      r.generated += static_cast<std::int64_t>(n);
      rep.generated_tokens += static_cast<std::int64_t>(n);
      accepted_total += static_cast<std::int64_t>(n);
      ++rep.request_steps;
      ++rep.decode_steps;
      if (r.generated >= r.output_len) {
        finish(index);
      } else {
        running[kept++] = index;
      }
    }
    running.resize(kept);
    running.insert(running.end(), admitted.begin(), admitted.end());

    if (options.sample_every > 0 && step % options.sample_every == 0) sample(step);
    if (options.progress && step % 16 == 0) options.progress(rep.requests_finished, rep.requests);
    ++step;
  }
  rep.steps = step;
  sample(step);
  if (options.progress) options.progress(rep.requests_finished, rep.requests);
  rep.wall_seconds = seconds(Clock::now() - start);
  rep.manager_seconds = seconds(in_manager);
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
        static_cast<double>(accepted_total) / static_cast<double>(rep.decode_steps);
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
