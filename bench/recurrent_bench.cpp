// Recurrent-state kernels on built-in shapes per TP rank: the Gated DeltaNet decode step and
// chunked prefill (Qwen3-Next at --tp 4: 4 key / 8 value heads of 128), the conv state update of
// the same layer, the Kimi Delta Attention decode step and chunked prefill (Kimi-Linear-48B at
// --tp 4: 8 heads of 128, the same state size as that GDN layer's), and the Mamba2 step
// (Nemotron-H 8B, --tp 1). Counters: tokens/s and the state
// bytes read and written per second.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "mixkv/kernels/recurrent_kernel.hpp"
#include "mixkv/model/describe.hpp"

namespace {

using namespace mixkv;
using namespace mixkv::kernels;

const model::LayerDesc& first_layer(const model::ModelDesc& desc, model::LayerKind kind) {
  for (const auto& l : desc.layers) {
    if (l.kind == kind) return l;
  }
  throw std::runtime_error("no layer of the kind");
}

const GdnLayerSpec& qwen_next_gdn() {
  static const GdnLayerSpec spec = [] {
    model::DescribeOptions o;
    o.tp = 4;
    const model::ModelDesc d = model::describe_refs("qwen3-next-80b-a3b", std::nullopt, o);
    return gdn_layer_spec(first_layer(d, model::LayerKind::kGdn), d.num_spec_tokens);
  }();
  return spec;
}

const KdaLayerSpec& kimi_linear_kda() {
  static const KdaLayerSpec spec = [] {
    model::DescribeOptions o;
    o.tp = 4;
    const model::ModelDesc d = model::describe_refs("kimi-linear-48b", std::nullopt, o);
    return kda_layer_spec(first_layer(d, model::LayerKind::kKda), d.num_spec_tokens);
  }();
  return spec;
}

const Mamba2LayerSpec& nemotron_mamba2() {
  static const Mamba2LayerSpec spec = [] {
    const model::ModelDesc d = model::describe_refs("nemotron-h-8b", std::nullopt, {});
    return mamba2_layer_spec(first_layer(d, model::LayerKind::kMamba2), d.num_spec_tokens);
  }();
  return spec;
}

// `requests` layer states back to back (slot i at i * state bytes), the given tensors random.
struct States {
  layout::LayerGeometry layer;
  std::vector<std::byte> cache;
  std::vector<std::int64_t> slots;
  std::vector<StateSequence> batch;
  States(std::int64_t requests, std::int64_t tokens,
         std::initializer_list<StateTensorPlace> places) {
    std::int64_t state_bytes = 0;
    for (const StateTensorPlace& p : places) {
      state_bytes = std::max(state_bytes, p.offset + storage_bytes(p.dtype, p.elements));
    }
    layer.layer = "bench";
    layer.recurrent = true;
    layer.state_bytes = state_bytes;
    layer.kernel_page_stride = state_bytes;
    cache.resize(static_cast<std::size_t>(state_bytes * requests));
    std::mt19937_64 rng(1);
    std::uniform_real_distribution<float> dist(-0.5f, 0.5f);
    for (std::int64_t i = 0; i < requests; ++i) {
      for (const StateTensorPlace& p : places) {
        std::vector<float> v(static_cast<std::size_t>(p.elements));
        for (auto& x : v) x = dist(rng);
        write_state(p, layer, cache, i, v);
      }
    }
    slots.resize(static_cast<std::size_t>(requests));
    for (std::int64_t i = 0; i < requests; ++i) slots[static_cast<std::size_t>(i)] = i;
    for (std::int64_t i = 0; i < requests; ++i) {
      batch.push_back({i, tokens, std::span(&slots[static_cast<std::size_t>(i)], 1)});
    }
  }
};

std::vector<float> random(std::int64_t n, float lo, float hi, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

std::vector<float> unit_rows(std::vector<float> v, std::int64_t width) {
  for (std::size_t at = 0; at < v.size(); at += static_cast<std::size_t>(width)) {
    float n = 0;
    for (std::int64_t i = 0; i < width; ++i) n += v[at + i] * v[at + i];
    for (std::int64_t i = 0; i < width; ++i) v[at + i] /= std::sqrt(n);
  }
  return v;
}

struct GdnData {
  std::vector<float> q, k, v, g, beta, out;
  GdnData(const GdnSpec& s, std::int64_t tokens)
      : q(unit_rows(random(tokens * s.num_k_heads * s.k_dim, -1, 1, 1), s.k_dim)),
        k(unit_rows(random(tokens * s.num_k_heads * s.k_dim, -1, 1, 2), s.k_dim)),
        v(random(tokens * s.num_v_heads * s.v_dim, -1, 1, 3)),
        g(random(tokens * s.num_v_heads, -0.5f, 0, 4)),
        beta(random(tokens * s.num_v_heads, 0, 1, 5)),
        out(static_cast<std::size_t>(tokens * s.num_v_heads * s.v_dim)) {}
  GdnInputs inputs() const { return {q, k, v, g, beta}; }
};

// KDA's gate is per key channel: g is [tokens, heads, k_dim].
struct KdaData {
  std::vector<float> q, k, v, g, beta, out;
  KdaData(const KdaSpec& s, std::int64_t tokens)
      : q(unit_rows(random(tokens * s.num_k_heads * s.k_dim, -1, 1, 1), s.k_dim)),
        k(unit_rows(random(tokens * s.num_k_heads * s.k_dim, -1, 1, 2), s.k_dim)),
        v(random(tokens * s.num_v_heads * s.v_dim, -1, 1, 3)),
        g(random(tokens * s.num_v_heads * s.k_dim, -0.5f, 0, 4)),
        beta(random(tokens * s.num_v_heads, 0, 1, 5)),
        out(static_cast<std::size_t>(tokens * s.num_v_heads * s.v_dim)) {}
  KdaInputs inputs() const { return {q, k, v, g, beta}; }
};

void set_counters(benchmark::State& state, std::int64_t tokens, std::int64_t state_bytes_moved) {
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens) * state.iterations(),
                                                  benchmark::Counter::kIsRate);
  state.counters["state_bytes/s"] =
      benchmark::Counter(static_cast<double>(state_bytes_moved) * state.iterations(),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1024);
}

std::int64_t bytes_of(const StateTensorPlace& p) { return storage_bytes(p.dtype, p.elements); }

// One decode step (one token per request, state updated in place) for a batch of range(0)
// requests; range(1) = 1 keeps the state in float32 (as Qwen3.5 asks) instead of the built-in's
// bfloat16.
void BM_GdnDecodeStep(benchmark::State& state) {
  GdnSpec s = qwen_next_gdn().gdn;
  if (state.range(1) == 1) s.place.dtype = DType::kFloat32;
  const std::int64_t requests = state.range(0);
  States st(requests, 1, {s.place});
  GdnData d(s, requests);
  for (auto _ : state) {
    gdn_step(s, st.layer, st.cache, st.batch, d.inputs(), d.out);
    benchmark::DoNotOptimize(d.out.data());
  }
  set_counters(state, requests, 2 * requests * bytes_of(s.place));
  state.SetLabel(std::string(to_string(s.place.dtype)));
}
BENCHMARK(BM_GdnDecodeStep)
    ->ArgsProduct({{1, 8, 32}, {0, 1}})
    ->ArgNames({"requests", "fp32"})
    ->Unit(benchmark::kMicrosecond);

// A prompt of range(0) tokens through one state: chunked (chunks of 64), and the per-token step
// for comparison.
void BM_GdnChunkedPrefill(benchmark::State& state) {
  const GdnSpec& s = qwen_next_gdn().gdn;
  const std::int64_t tokens = state.range(0);
  States st(1, tokens, {s.place});
  GdnData d(s, tokens);
  for (auto _ : state) {
    gdn_chunked_prefill(s, st.layer, st.cache, st.batch, d.inputs(), 64, d.out);
    benchmark::DoNotOptimize(d.out.data());
  }
  set_counters(state, tokens, 2 * bytes_of(s.place));
}
BENCHMARK(BM_GdnChunkedPrefill)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);

void BM_GdnStepPrefill(benchmark::State& state) {
  const GdnSpec& s = qwen_next_gdn().gdn;
  const std::int64_t tokens = state.range(0);
  States st(1, tokens, {s.place});
  GdnData d(s, tokens);
  for (auto _ : state) {
    gdn_step(s, st.layer, st.cache, st.batch, d.inputs(), d.out);
    benchmark::DoNotOptimize(d.out.data());
  }
  set_counters(state, tokens, 2 * bytes_of(s.place));
}
BENCHMARK(BM_GdnStepPrefill)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);

// KDA's decode step, as BM_GdnDecodeStep (Kimi-Linear's state is bfloat16 unless --ssm-dtype
// says otherwise; range(1) = 1 keeps it in float32).
void BM_KdaDecodeStep(benchmark::State& state) {
  KdaSpec s = kimi_linear_kda().kda;
  if (state.range(1) == 1) s.place.dtype = DType::kFloat32;
  const std::int64_t requests = state.range(0);
  States st(requests, 1, {s.place});
  KdaData d(s, requests);
  for (auto _ : state) {
    kda_step(s, st.layer, st.cache, st.batch, d.inputs(), d.out);
    benchmark::DoNotOptimize(d.out.data());
  }
  set_counters(state, requests, 2 * requests * bytes_of(s.place));
  state.SetLabel(std::string(to_string(s.place.dtype)));
}
BENCHMARK(BM_KdaDecodeStep)
    ->ArgsProduct({{1, 8, 32}, {0, 1}})
    ->ArgNames({"requests", "fp32"})
    ->Unit(benchmark::kMicrosecond);

void BM_KdaChunkedPrefill(benchmark::State& state) {
  const KdaSpec& s = kimi_linear_kda().kda;
  const std::int64_t tokens = state.range(0);
  States st(1, tokens, {s.place});
  KdaData d(s, tokens);
  for (auto _ : state) {
    kda_chunked_prefill(s, st.layer, st.cache, st.batch, d.inputs(), 64, d.out);
    benchmark::DoNotOptimize(d.out.data());
  }
  set_counters(state, tokens, 2 * bytes_of(s.place));
}
BENCHMARK(BM_KdaChunkedPrefill)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);

void BM_KdaStepPrefill(benchmark::State& state) {
  const KdaSpec& s = kimi_linear_kda().kda;
  const std::int64_t tokens = state.range(0);
  States st(1, tokens, {s.place});
  KdaData d(s, tokens);
  for (auto _ : state) {
    kda_step(s, st.layer, st.cache, st.batch, d.inputs(), d.out);
    benchmark::DoNotOptimize(d.out.data());
  }
  set_counters(state, tokens, 2 * bytes_of(s.place));
}
BENCHMARK(BM_KdaStepPrefill)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond);

// The GDN layer's conv state update for a decode batch.
void BM_ConvDecodeStep(benchmark::State& state) {
  const ConvSpec& c = qwen_next_gdn().conv;
  const std::int64_t requests = state.range(0);
  States st(requests, 1, {c.place});
  const std::vector<float> x = random(requests * c.channels, -1, 1, 1);
  const std::vector<float> w = random(c.channels * c.kernel, -1, 1, 2);
  std::vector<float> out(x.size());
  for (auto _ : state) {
    conv_update(c, st.layer, st.cache, st.batch, {x, w, {}}, out);
    benchmark::DoNotOptimize(out.data());
  }
  set_counters(state, requests, 2 * requests * bytes_of(c.place));
}
BENCHMARK(BM_ConvDecodeStep)->Arg(8)->Arg(32)->Unit(benchmark::kMicrosecond);

void BM_Mamba2Step(benchmark::State& state) {
  const Mamba2Spec& m = nemotron_mamba2().ssm;
  const std::int64_t requests = state.range(0);
  States st(requests, 1, {m.place});
  const std::int64_t bc = m.groups * m.state_size;
  const std::vector<float> x = random(requests * m.heads * m.head_dim, -1, 1, 1);
  const std::vector<float> dt = random(requests * m.heads, -3, 1, 2);
  const std::vector<float> b = random(requests * bc, -1, 1, 3);
  const std::vector<float> c = random(requests * bc, -1, 1, 4);
  const std::vector<float> a = random(m.heads, -4, -0.5f, 5);
  const std::vector<float> d = random(m.heads, -1, 1, 6);
  const std::vector<float> bias = random(m.heads, -1, 1, 7);
  std::vector<float> out(x.size());
  const Mamba2Inputs in{x, dt, b, c, a, d, bias};
  for (auto _ : state) {
    mamba2_step(m, st.layer, st.cache, st.batch, in, out);
    benchmark::DoNotOptimize(out.data());
  }
  set_counters(state, requests, 2 * requests * bytes_of(m.place));
}
BENCHMARK(BM_Mamba2Step)->Arg(1)->Arg(8)->Arg(32)->Unit(benchmark::kMicrosecond);

}  // namespace
