// Prefix hits through recurrent groups are exact with the real recurrent kernels: a request that
// restores a kept snapshot and computes the rest ends with the same state bytes, and produced the
// same outputs, as the same request recomputed from scratch in a second manager and cache — with
// and without a drafter. Each sampled layer runs as in a model: a causal conv over per-token
// inputs (conv_update), whose output is split into the recurrence's inputs (Gated DeltaNet: q, k,
// v with q and k L2-normalised, then gdn_chunked_prefill for a prefill and gdn_step for a decode
// step; Mamba2: x, B, C, then mamba2_step). Inputs are a seeded function of (layer, position,
// token), so two requests with the same prefix get the same inputs. Attention K/V after a hit
// is covered by prefix_hit_exactness_test.cpp; here attention groups only take part in the hit.
//
// Chunked results depend on where a prefill is split (a state is rounded to its dtype between
// calls, and chunks count from a call's first token), so the runner splits every prefill at every
// snapshot boundary (docs/cache.md): then the state at a boundary is a function of the tokens
// alone, whichever request kept it and wherever a hit started. The one scheduler drives both
// managers, with the test's engine as its model and drafter.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <tuple>

#include "mixkv/attn/attention_groups.hpp"
#include "mixkv/cache/kv_cache_manager.hpp"
#include "mixkv/kernels/recurrent_kernel.hpp"
#include "mixkv/layout/geometry.hpp"
#include "mixkv/sched/scheduler.hpp"
#include "test_support.hpp"

namespace mixkv::cache {
namespace {

using mixkv::testing::kMiB;
constexpr std::int64_t kChunk = 64;  // gdn_chunked_prefill's chunk, the usual one

std::uint64_t kernel_mix(std::uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1) from the element index of a seeded stream.
float uniform(std::uint64_t seed, std::uint64_t e) {
  return static_cast<float>(kernel_mix(seed + (e + 1) * 0x9E3779B97F4A7C15ULL) >> 40) /
             static_cast<float>(1 << 23) -
         1.0f;
}

std::vector<float> stream(std::uint64_t seed, std::int64_t n, float scale) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = scale * uniform(seed, i);
  return v;
}

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// One recurrent layer the test runs, with its specs and fixed weights.
struct Layer {
  const layout::LayerGeometry* geo = nullptr;
  std::uint64_t seed = 0;
  bool gdn = false;
  kernels::GdnLayerSpec g;
  kernels::Mamba2LayerSpec m;
  std::vector<float> conv_w, conv_b, a, d, dt_bias;  // a, d, dt_bias: Mamba2 only
  const kernels::ConvSpec& conv() const { return gdn ? g.conv : m.conv; }
};

// The scheduler's model (it runs the sampled layers' kernels as a model would) and drafter; the
// test scripts each step's drafts, how many are accepted and the token sampled. Requests are
// named by the test's ids; rid() gives the manager's.
class KernelEngine final : public sched::Model, public spec::Drafter {
 public:
  // Runs the kernels on the first layer of the first two recurrent groups and of the last one, and
  // on the last recurrent layer: several groups' slots and both ends of the layer list, at about
  // 10 s per test under sanitizers. (prefix_hit_exactness_test.cpp covers every layer's slots.)
  KernelEngine(const model::ModelDesc& desc, const plan::CachePlan& plan, int k)
      : k_(k), manager_(plan, k), sched_(manager_, plan, options(k)) {
    geometry_ = layout::make_geometry(desc, plan, attn::build_attention_groups(desc, plan));
    std::map<int, std::vector<std::size_t>> by_group;
    for (std::size_t i = 0; i < geometry_.layers.size(); ++i) {
      if (geometry_.layers[i].recurrent) by_group[geometry_.layers[i].kv_cache_group].push_back(i);
    }
    tensors_.resize(plan.tensors.size());
    std::vector<std::size_t> firsts, run;
    std::size_t last = 0;
    for (const auto& [group, members] : by_group) {
      firsts.push_back(members.front());
      last = std::max(last, members.back());
    }
    for (std::size_t i : {firsts.front(), firsts[std::min<std::size_t>(1, firsts.size() - 1)],
                          firsts.back(), last}) {
      if (std::find(run.begin(), run.end(), i) == run.end()) run.push_back(i);
    }
    for (std::size_t i : run) add_layer(desc.layers[i], geometry_.layers[i], plan, i);
  }

  const KvCacheManager& manager() const { return manager_; }
  RequestId rid(RequestId id) const {
    return RequestId{static_cast<std::int64_t>(index_.at(id.value()))};
  }
  std::vector<TokenId> tokens(RequestId id) const {
    const auto t = sched_.tokens(index_.at(id.value()));
    return {t.begin(), t.end()};
  }
  std::int64_t recurrent_tokens(RequestId id) const { return computed_.at(id.value()); }
  std::size_t num_layers() const { return layers_.size(); }

  // Queues `prompt`; one step admits it, computes what the hit does not cover and commits it
  // with `first` sampled (a request of one token to generate then finishes, its blocks cached
  // in the free queue). Returns the hit.
  std::int64_t prefill(RequestId id, const std::vector<TokenId>& prompt, TokenId first,
                       std::int64_t max_tokens = 1 << 20) {
    const std::size_t i = sched_.add({prompt, max_tokens, "request " + std::to_string(id.value())});
    index_[id.value()] = i;
    test_id_[i] = id.value();
    script_[i] = {{}, 0, first};
    sched_.step(*this, this);
    return sched_.stats(i).prefix_hit_tokens;
  }

  // One step of every running request: `id` verifies the last known token plus `drafts` (a
  // verify writing one checkpoint per position when k > 0), of which `accepted` are accepted,
  // then `bonus` is sampled.
  void decode(RequestId id, const std::vector<TokenId>& drafts, int accepted, TokenId bonus) {
    ASSERT_EQ(static_cast<int>(drafts.size()), k_);
    script_[index_.at(id.value())] = {drafts, accepted, bonus};
    sched_.step(*this, this);
  }

  // spec::Drafter: the scripted drafts (none for a request the step does not script).
  std::string name() const override { return "scripted"; }
  std::vector<TokenId> propose(const spec::DraftContext& ctx, int) override {
    const auto it = script_.find(ctx.request);
    return it == script_.end() ? std::vector<TokenId>{} : it->second.drafts;
  }

  // sched::Model: runs every work through the sampled layers, picks the scripted tokens.
  std::int64_t vocab_size() const override { return std::int64_t{1} << 30; }
  sched::ModelOutput forward(std::span<const sched::Work> batch) override {
    sched::ModelOutput out;
    for (const sched::Work& w : batch) {
      const auto it = script_.find(w.request);
      const Script s = it == script_.end() ? Script{{}, 0, 1} : it->second;
      if (it != script_.end()) script_.erase(it);
      const auto n = static_cast<std::int64_t>(w.tokens.size());
      if (w.prefill) {
        prefill_work(w);
        out.picks.insert(out.picks.end(), static_cast<std::size_t>(n - 1), 0);
        out.picks.push_back(s.sampled);
        continue;
      }
      decode_work(w);
      for (std::int64_t i = 0; i < n; ++i) {
        out.picks.push_back(i < s.accepted ? w.tokens[static_cast<std::size_t>(i + 1)] : s.sampled);
      }
    }
    return out;
  }

  // Every state tensor of request `id`'s live state in every run layer, decoded; and raw.
  std::vector<std::vector<float>> live_states(RequestId test_id) const {
    const RequestId id = rid(test_id);
    std::vector<std::vector<float>> out;
    for (const Layer& l : layers_) {
      const std::int64_t live = manager_.block_table(id, l.geo->kv_cache_group)[0].value();
      const auto& cache = tensors_[static_cast<std::size_t>(l.geo->tensor)];
      out.push_back(kernels::read_state(l.conv().place, *l.geo, cache, live));
      out.push_back(
          kernels::read_state(l.gdn ? l.g.gdn.place : l.m.ssm.place, *l.geo, cache, live));
    }
    return out;
  }
  std::vector<std::byte> live_bytes(RequestId test_id) const {
    const RequestId id = rid(test_id);
    std::vector<std::byte> out;
    for (const Layer& l : layers_) {
      const auto s = state(l, manager_.block_table(id, l.geo->kv_cache_group)[0]);
      out.insert(out.end(), s.begin(), s.end());
    }
    return out;
  }

  // (request, layer, position) -> the layer's outputs for that token (conv, then recurrence):
  // the last ones computed there (a rejected draft's are overwritten by the next step's), as a
  // 64-bit digest of their bits (any changed bit changes it but with odds of 2^-64), and as
  // values when keep_values() was called (they cost 9 KiB per token and layer).
  using OutputKey = std::tuple<std::int64_t, std::size_t, std::int64_t>;
  struct Output {
    std::uint64_t digest = 0;
    std::vector<float> values;
  };
  const std::map<OutputKey, Output>& outputs() const { return outputs_; }
  void keep_values() { keep_values_ = true; }

 private:
  struct Script {
    std::vector<TokenId> drafts;
    int accepted = 0;
    TokenId sampled = 0;
  };
  static sched::SchedulerOptions options(int k) {
    sched::SchedulerOptions o;
    o.num_spec_tokens = k;
    o.prefill_chunk = 0;  // whole prompts: the engine splits them at snapshot boundaries itself
    o.cap_drafts = false;
    // Both runs must draft alike: a fixed cost, not their own timings, sets the draft lengths.
    o.step_cost = std::make_shared<sched::LinearStepCost>(1.0, 0.1);
    return o;
  }

  // A prefill from the hit (w.start): restore or zero each layer's live state, then run the
  // tokens in pieces ending at every snapshot boundary and at the prompt's end.
  void prefill_work(const sched::Work& w) {
    const RequestId id{test_id_.at(w.request)};
    const std::int64_t hit = w.start;
    const std::int64_t len = hit + static_cast<std::int64_t>(w.tokens.size());
    const std::int64_t c = manager_.snapshot_interval();
    for (const Layer& l : layers_) {
      const auto group = static_cast<std::size_t>(l.geo->kv_cache_group);
      const RecurrentStep step = w.recurrent.at(group);
      const BlockId live = w.block_tables.at(group)[0];
      if (!step.restore_from.is_null()) {
        EXPECT_EQ(hit % c, 0);
        copy_state(l, step.restore_from, live);
      } else {
        EXPECT_EQ(hit, 0);
        zero_state(l, live);  // a fresh request starts from zero states
      }
      // The boundary to keep is one the pieces below end at.
      EXPECT_TRUE(step.snapshot_at == 0 ||
                  (step.snapshot_at % c == 0 && step.snapshot_at > hit && step.snapshot_at <= len))
          << step.snapshot_at;
      for (std::int64_t p = hit; p < len;) {
        const std::int64_t end = std::min(len, (p / c + 1) * c);
        run(l, id, live.value(), std::vector<std::int64_t>{live.value()}, p,
            w.tokens.subspan(static_cast<std::size_t>(p - hit), static_cast<std::size_t>(end - p)),
            /*prefill=*/true);
        if (end == step.snapshot_at) copy_state(l, live, step.snapshot);
        p = end;
      }
    }
    computed_[id.value()] += len - hit;
  }

  // A decode or verify step: one checkpoint per token, the manager's snapshot copied from its
  // checkpoint.
  void decode_work(const sched::Work& w) {
    const RequestId id{test_id_.at(w.request)};
    const std::int64_t n = w.start;
    const auto count = static_cast<std::int64_t>(w.tokens.size());
    for (const Layer& l : layers_) {
      const auto group = static_cast<std::size_t>(l.geo->kv_cache_group);
      const RecurrentStep step = w.recurrent.at(group);
      EXPECT_TRUE(step.restore_from.is_null());
      const auto table = w.block_tables.at(group);
      std::vector<std::int64_t> outs;
      for (std::int64_t j = 0; j < count; ++j) {
        outs.push_back(table[static_cast<std::size_t>(j)].value());
      }
      run(l, id, outs[0], outs, n, w.tokens, /*prefill=*/false);
      if (step.snapshot_at > 0) {
        const std::int64_t j = step.snapshot_at - n - 1;  // checkpoint j: after token n + j
        EXPECT_TRUE(j >= 0 && j < count) << step.snapshot_at;
        if (j < 0 || j >= count) continue;
        copy_state(l, BlockId(static_cast<std::int32_t>(outs[static_cast<std::size_t>(j)])),
                   step.snapshot);
      }
    }
    computed_[id.value()] += count;
  }

  void add_layer(const model::LayerDesc& desc, const layout::LayerGeometry& geo,
                 const plan::CachePlan& plan, std::size_t index) {
    Layer l;
    l.geo = &geo;
    l.seed = kernel_mix(0x5EED0000ULL + index);
    l.gdn = desc.kind == model::LayerKind::kGdn;
    ASSERT_TRUE(l.gdn || desc.kind == model::LayerKind::kMamba2) << desc.name;
    if (l.gdn) {
      l.g = kernels::gdn_layer_spec(desc, k_);
    } else {
      l.m = kernels::mamba2_layer_spec(desc, k_);
      const std::int64_t h = l.m.ssm.heads;
      l.a = stream(l.seed ^ 1, h, 1.0f);
      for (float& v : l.a) v = -std::exp(v);  // A = -exp(A_log), as Mamba2 models store it
      l.d = stream(l.seed ^ 2, h, 1.0f);
      l.dt_bias = stream(l.seed ^ 3, h, 1.0f);
    }
    const kernels::ConvSpec& conv = l.conv();
    l.conv_w = stream(l.seed ^ 4, conv.channels * conv.kernel, 0.5f);
    l.conv_b = stream(l.seed ^ 5, conv.channels, 0.1f);
    auto& t = tensors_[static_cast<std::size_t>(geo.tensor)];
    // 0xFF is NaN in every float dtype: a state nobody wrote shows up.
    if (t.empty()) {
      t.assign(static_cast<std::size_t>(plan.tensors[static_cast<std::size_t>(geo.tensor)].bytes),
               std::byte{0xFF});
    }
    layers_.push_back(std::move(l));
  }

  std::span<std::byte> state(const Layer& l, BlockId b) {
    EXPECT_FALSE(b.is_null());
    return std::span<std::byte>(tensors_[static_cast<std::size_t>(l.geo->tensor)])
        .subspan(static_cast<std::size_t>(l.geo->offset + b.value() * l.geo->kernel_page_stride),
                 static_cast<std::size_t>(l.geo->state_bytes));
  }
  std::span<const std::byte> state(const Layer& l, BlockId b) const {
    return std::span<const std::byte>(tensors_[static_cast<std::size_t>(l.geo->tensor)])
        .subspan(static_cast<std::size_t>(l.geo->offset + b.value() * l.geo->kernel_page_stride),
                 static_cast<std::size_t>(l.geo->state_bytes));
  }
  // A state copy is a byte copy, as an engine copies a state block.
  void copy_state(const Layer& l, BlockId from, BlockId to) {
    const auto src = state(l, from);
    std::memcpy(state(l, to).data(), src.data(), src.size());
  }
  void zero_state(const Layer& l, BlockId b) {
    auto& cache = tensors_[static_cast<std::size_t>(l.geo->tensor)];
    const kernels::StateTensorPlace& rec = l.gdn ? l.g.gdn.place : l.m.ssm.place;
    for (const auto* place : {&l.conv().place, &rec}) {
      kernels::write_state(*place, *l.geo, cache, b.value(),
                           std::vector<float>(static_cast<std::size_t>(place->elements), 0.0f));
    }
  }

  // Runs `seq` (tokens at positions first..) through layer `l` from state `in` into `outs`
  // (one slot: the final state; one per token: checkpoints).
  void run(const Layer& l, RequestId id, std::int64_t in, const std::vector<std::int64_t>& outs,
           std::int64_t first, std::span<const TokenId> seq, bool prefill) {
    auto& cache = tensors_[static_cast<std::size_t>(l.geo->tensor)];
    const auto n = static_cast<std::int64_t>(seq.size());
    const kernels::StateSequence s{in, n, outs};
    const auto batch = std::span<const kernels::StateSequence>(&s, 1);
    const kernels::ConvSpec& conv = l.conv();
    const std::int64_t ch = conv.channels;
    // Per-token inputs: the conv's input row, then one value per head (GDN: g and beta;
    // Mamba2: dt), all from (layer, position, token).
    const std::int64_t heads = l.gdn ? l.g.gdn.num_v_heads : l.m.ssm.heads;
    std::vector<float> x(static_cast<std::size_t>(n * ch)), per_head;
    for (std::int64_t t = 0; t < n; ++t) {
      const std::uint64_t seed = kernel_mix(
          l.seed ^ kernel_mix(static_cast<std::uint64_t>(first + t) * 1000003ULL +
                              static_cast<std::uint64_t>(seq[static_cast<std::size_t>(t)])));
      for (std::int64_t c = 0; c < ch; ++c)
        x[static_cast<std::size_t>(t * ch + c)] = uniform(seed, c);
      for (std::int64_t h = 0; h < 2 * heads; ++h) per_head.push_back(uniform(seed, ch + h));
    }
    std::vector<float> conv_out(x.size());
    kernels::conv_update(conv, *l.geo, cache, batch, {x, l.conv_w, l.conv_b}, conv_out);

    std::vector<float> out;
    if (l.gdn) {
      const kernels::GdnSpec& g = l.g.gdn;
      const std::int64_t qk = g.num_k_heads * g.k_dim, vw = g.num_v_heads * g.v_dim;
      std::vector<float> q, k, v, gate, beta;
      for (std::int64_t t = 0; t < n; ++t) {
        const float* row = conv_out.data() + t * ch;
        // Qwen3-Next L2-normalises q and k per head before the kernel.
        for (const float* part : {row, row + qk}) {
          auto& dst = part == row ? q : k;
          for (std::int64_t h = 0; h < g.num_k_heads; ++h) {
            float sum = 0;
            for (std::int64_t i = 0; i < g.k_dim; ++i)
              sum += part[h * g.k_dim + i] * part[h * g.k_dim + i];
            const float inv = 1.0f / std::sqrt(sum + 1e-6f);
            for (std::int64_t i = 0; i < g.k_dim; ++i) dst.push_back(part[h * g.k_dim + i] * inv);
          }
        }
        v.insert(v.end(), row + 2 * qk, row + 2 * qk + vw);
        for (std::int64_t h = 0; h < heads; ++h) {
          // Log decay in (-0.5, 0): states forget slowly, so early tokens still matter.
          gate.push_back(-0.25f * (1.0f + per_head[static_cast<std::size_t>(t * 2 * heads + h)]));
          beta.push_back(sigmoid(per_head[static_cast<std::size_t>(t * 2 * heads + heads + h)]));
        }
      }
      out.resize(static_cast<std::size_t>(n * vw));
      const kernels::GdnInputs gi{q, k, v, gate, beta};
      if (prefill) {
        kernels::gdn_chunked_prefill(g, *l.geo, cache, batch, gi, kChunk, out);
      } else {
        kernels::gdn_step(g, *l.geo, cache, batch, gi, out);
      }
    } else {
      const kernels::Mamba2Spec& m = l.m.ssm;
      const std::int64_t xw = m.heads * m.head_dim, bw = m.groups * m.state_size;
      std::vector<float> xs, b, c, dt;
      for (std::int64_t t = 0; t < n; ++t) {
        const float* row = conv_out.data() + t * ch;
        xs.insert(xs.end(), row, row + xw);
        b.insert(b.end(), row + xw, row + xw + bw);
        c.insert(c.end(), row + xw + bw, row + xw + 2 * bw);
        for (std::int64_t h = 0; h < heads; ++h)
          dt.push_back(per_head[static_cast<std::size_t>(t * 2 * heads + h)] - 2.0f);
      }
      out.resize(static_cast<std::size_t>(n * xw));
      kernels::mamba2_step(m, *l.geo, cache, batch, {xs, dt, b, c, l.a, l.d, l.dt_bias}, out);
    }
    const std::size_t li = static_cast<std::size_t>(&l - layers_.data());
    const std::size_t ow = out.size() / static_cast<std::size_t>(n);
    for (std::int64_t t = 0; t < n; ++t) {
      const std::span<const float> conv_row(conv_out.data() + t * ch, static_cast<std::size_t>(ch));
      const std::span<const float> out_row(out.data() + static_cast<std::size_t>(t) * ow, ow);
      Output& o = outputs_[{id.value(), li, first + t}];
      o.digest = 0;
      for (const auto row : {conv_row, out_row}) {
        for (float f : row) o.digest = kernel_mix(o.digest ^ std::bit_cast<std::uint32_t>(f));
      }
      if (keep_values_) {
        o.values.assign(conv_row.begin(), conv_row.end());
        o.values.insert(o.values.end(), out_row.begin(), out_row.end());
      }
    }
  }

  int k_;
  KvCacheManager manager_;
  sched::Scheduler sched_;
  layout::Geometry geometry_;
  std::vector<Layer> layers_;
  std::vector<std::vector<std::byte>> tensors_;    // empty: no run layer lives there
  std::map<std::int64_t, std::size_t> index_;      // the test's id -> the scheduler's request
  std::map<std::size_t, std::int64_t> test_id_;    // and back
  std::map<std::size_t, Script> script_;           // the step's scripted requests
  std::map<std::int64_t, std::int64_t> computed_;  // tokens run through the recurrent layers
  std::map<OutputKey, Output> outputs_;
  bool keep_values_ = false;
};

bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Request `id` in `x` (which took a hit) against the same request in `y` (from scratch): live
// states byte for byte, and every output `x` computed equal to `y`'s at the same layer and
// position. Returns how many outputs were compared.
std::int64_t expect_same(const KernelEngine& x, const KernelEngine& y, RequestId id) {
  EXPECT_EQ(x.manager().num_computed(x.rid(id)), y.manager().num_computed(y.rid(id)));
  const auto xs = x.live_states(id);
  const auto ys = y.live_states(id);
  EXPECT_EQ(xs.size(), 2 * x.num_layers());
  for (std::size_t i = 0; i < xs.size(); ++i) {
    for (float f : xs[i]) {
      EXPECT_TRUE(std::isfinite(f)) << "state tensor " << i << " holds bytes nobody wrote";
      if (!std::isfinite(f)) break;
    }
    EXPECT_TRUE(same_floats(xs[i], ys[i])) << "state tensor " << i;
  }
  EXPECT_TRUE(x.live_bytes(id) == y.live_bytes(id));
  std::int64_t compared = 0;
  for (const auto& [key, out] : x.outputs()) {
    if (std::get<0>(key) != id.value()) continue;
    const auto it = y.outputs().find(key);
    EXPECT_TRUE(it != y.outputs().end()) << "no output at position " << std::get<2>(key);
    if (it == y.outputs().end()) continue;
    EXPECT_EQ(out.digest, it->second.digest)
        << "output of layer " << std::get<1>(key) << " at position " << std::get<2>(key);
    ++compared;
  }
  return compared;
}

std::vector<TokenId> token_run(std::int64_t n, TokenId start) {
  std::vector<TokenId> t(static_cast<std::size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

plan::CachePlan small_plan(const model::ModelDesc& desc, std::int64_t memory) {
  plan::PlanOptions o;
  o.policy = plan::Policy::kVllm;  // the smaller snapshot interval (an attention block)
  o.backend = backend::Backend::kCpu;
  o.memory_bytes = memory;
  o.max_model_len = 2048;
  o.request_len = 1024;
  return plan::make_plan(desc, o);
}

// The hit B takes after A in a bare manager with `k` speculative tokens.
std::int64_t hit_only(const plan::CachePlan& plan, int k, const std::vector<TokenId>& a,
                      const std::vector<TokenId>& b) {
  KvCacheManager m(plan, k);
  m.add_request(RequestId{1}, a);
  EXPECT_TRUE(m.admit(RequestId{1}, k).has_value());
  m.commit(RequestId{1}, static_cast<std::int64_t>(a.size()), std::vector<TokenId>{7});
  m.free(RequestId{1});
  m.add_request(RequestId{2}, b);
  return m.admit(RequestId{2}, k).value_or(-1);
}

// With c the snapshot interval: A (2.5 c + 20 tokens) is prefilled in `x` and finishes; B (A's
// first 2.25 c tokens, then c + 37 of its own) takes the hit in `x` and is computed from scratch in
// `y`; both then take the same speculative steps: first one rejecting every draft, then one
// accepting all, then random.
void run_case(const model::ModelDesc& desc, const plan::CachePlan& plan, int k, int steps) {
  KernelEngine x(desc, plan, k), y(desc, plan, k);
  ASSERT_GT(x.num_layers(), 0u);
  const std::int64_t c = x.manager().snapshot_interval();
  ASSERT_GT(c, 0);
  const std::int64_t a_len = 2 * c + c / 2 + 20, shared = 2 * c + c / 4;
  const auto a = token_run(a_len, 1);
  auto b = std::vector<TokenId>(a.begin(), a.begin() + shared);
  // B's own tokens cross the next boundary: its prefill from the hit is split there, and the
  // recomputation's at every boundary before it too.
  const auto own = token_run(c + 37, 50000);
  b.insert(b.end(), own.begin(), own.end());
  const RequestId ida{1}, idb{2};

  // A generates one token and finishes: B's hit comes from cached blocks in the free queue.
  ASSERT_EQ(x.prefill(ida, a, 7, 1), 0);
  ASSERT_EQ(x.manager().num_requests(), 0u);
  const std::int64_t hit = x.prefill(idb, b, 8);
  ASSERT_EQ(y.prefill(idb, b, 8), 0);
  // The latest snapshot A kept at or before the shared tokens: A's prefill keeps one per step,
  // its last boundary, so that is the hit when A's prompt ends in the same interval as `shared`.
  EXPECT_EQ(hit, shared / c * c);
  EXPECT_GE(hit, c);
  EXPECT_EQ(hit_only(plan, 0, a, b), hit) << "the drafter costs no hit tokens";
  // The hit skipped `hit` tokens of recurrent compute.
  EXPECT_EQ(x.recurrent_tokens(idb) + hit, y.recurrent_tokens(idb));
  const std::int64_t after_prefill = expect_same(x, y, idb);
  EXPECT_EQ(after_prefill, (static_cast<std::int64_t>(b.size()) - hit) *
                               static_cast<std::int64_t>(x.num_layers()));

  std::mt19937 rng(5);
  for (int s = 0; s < steps; ++s) {
    std::vector<TokenId> drafts;
    for (int d = 0; d < k; ++d) drafts.push_back(static_cast<TokenId>(60000 + 10 * s + d));
    const int accepted = s == 0 ? 0 : s == 1 ? k : static_cast<int>(rng() % (k + 1));
    x.decode(idb, drafts, accepted, 70000 + s);
    y.decode(idb, drafts, accepted, 70000 + s);
    if (s < 2) {
      EXPECT_GT(expect_same(x, y, idb), after_prefill) << "step " << s;
    }
  }
  EXPECT_GT(expect_same(x, y, idb), after_prefill);
  EXPECT_EQ(x.tokens(idb), y.tokens(idb));
  EXPECT_EQ(x.manager().check_invariants(), "");
  EXPECT_EQ(y.manager().check_invariants(), "");
}

model::ModelDesc qwen_next(int k) {
  model::DescribeOptions d;
  d.tp = 4;
  d.num_spec_tokens = k;
  return testing::describe_builtin("qwen3-next-80b-a3b", {}, d);
}

model::ModelDesc nemotron(int k) {
  model::DescribeOptions d;
  d.tp = 8;  // 16 heads per rank: half the compute of TP 4, the same snapshot interval
  d.num_spec_tokens = k;
  return testing::describe_builtin("nemotron-h-8b", {}, d);
}

TEST(RecurrentPrefixHitKernels, GatedDeltaNetHitMatchesRecomputationBitForBit) {
  const auto desc = qwen_next(0);
  const auto plan = small_plan(desc, 128 * kMiB);
  run_case(desc, plan, 0, 3);
}

TEST(RecurrentPrefixHitKernels, GatedDeltaNetHitWithADrafterMatchesRecomputationBitForBit) {
  const auto desc = qwen_next(2);
  const auto plan = small_plan(desc, 128 * kMiB);
  run_case(desc, plan, 2, 4);
}

TEST(RecurrentPrefixHitKernels, Mamba2HitMatchesRecomputationBitForBit) {
  const auto desc = nemotron(0);
  const auto plan = small_plan(desc, 128 * kMiB);
  run_case(desc, plan, 0, 3);
}

TEST(RecurrentPrefixHitKernels, Mamba2HitWithADrafterMatchesRecomputationBitForBit) {
  const auto desc = nemotron(3);
  const auto plan = small_plan(desc, 128 * kMiB);
  run_case(desc, plan, 3, 4);
}

// The largest |a - b| over two equally long runs of values, relative to the largest |b|.
double relative_difference(std::span<const float> a, std::span<const float> b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

// A snapshot kept by decode steps holds what the per-token kernel computed; a from-scratch
// prefill of the same tokens runs the chunked kernel and rounds the state at other points. The
// hit is still taken, and B's states and outputs stay within a few bf16 roundings of the
// recomputation (docs/cache.md: exact only against a recomputation that ran the same calls).
TEST(RecurrentPrefixHitKernels, SnapshotKeptByDecodeStepsServesAHitWithinRounding) {
  const int k = 2;
  const auto desc = qwen_next(k);
  const auto plan = small_plan(desc, 128 * kMiB);
  KernelEngine x(desc, plan, k), y(desc, plan, k);
  x.keep_values();
  y.keep_values();
  const std::int64_t c = x.manager().snapshot_interval();
  ASSERT_GT(c, 8);
  const RequestId ida{1}, idb{2};
  // A's prompt ends just before the boundary c: only its decode steps cross it.
  ASSERT_EQ(x.prefill(ida, token_run(c - 3, 1), 5), 0);
  std::mt19937 rng(11);
  for (int s = 0; x.manager().num_computed(x.rid(ida)) < c + 8; ++s) {
    x.decode(ida, {100 + s, 200 + s}, static_cast<int>(rng() % (k + 1)), 400 + s);
  }
  std::vector<TokenId> b = x.tokens(ida);
  b.resize(static_cast<std::size_t>(c + 5));
  EXPECT_EQ(x.prefill(idb, b, 9), c);
  ASSERT_EQ(y.prefill(idb, b, 9), 0);
  const auto xs = x.live_states(idb), ys = y.live_states(idb);
  ASSERT_EQ(xs.size(), ys.size());
  // bf16 states: two roundings of nearly equal floats differ by at most one ulp, 2^-7 of the
  // value; allow two, relative to the largest (measured: 0.0055). Outputs are float, computed
  // from states that differ by that much only in their last bits (measured: 3.2e-5).
  constexpr double kStateBound = 1.0 / 64, kOutputBound = 1.0 / 1024;
  double worst = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    worst = std::max(worst, relative_difference(xs[i], ys[i]));
  }
  EXPECT_LE(worst, kStateBound);
  std::int64_t compared = 0;
  for (const auto& [key, out] : x.outputs()) {
    if (std::get<0>(key) != idb.value()) continue;
    EXPECT_LE(relative_difference(out.values, y.outputs().at(key).values), kOutputBound)
        << std::get<2>(key);
    ++compared;
  }
  EXPECT_EQ(compared, 5 * static_cast<std::int64_t>(x.num_layers()));
}

}  // namespace
}  // namespace mixkv::cache
