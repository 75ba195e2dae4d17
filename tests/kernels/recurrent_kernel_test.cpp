// Recurrent kernels against their double-precision references: the conv state update, the Gated
// DeltaNet and Kimi Delta Attention steps and chunked prefills, the Mamba2 step, over random
// shapes, lengths, dtypes and state slots; speculative checkpoints; layer specs from built-in
// models; bad input.
#include "mixkv/kernels/recurrent_kernel.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>

#include "mixkv/attn/attention_groups.hpp"
#include "mixkv/cache/kv_cache_manager.hpp"
#include "mixkv/kernels/convert.hpp"
#include "mixkv/kernels/recurrent_reference.hpp"
#include "mixkv/kernels/verify.hpp"
#include "mixkv/layout/geometry.hpp"
#include "mixkv/plan/plan.hpp"
#include "test_support.hpp"

namespace mixkv::kernels {
namespace {

std::vector<float> random_values(std::mt19937_64& rng, std::int64_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> out(static_cast<std::size_t>(n));
  for (auto& x : out) x = dist(rng);
  return out;
}

// Rows of `width` scaled to unit L2 norm (GDN's q and k are normalised by the model).
void normalize_rows(std::vector<float>& v, std::int64_t width) {
  for (std::size_t r = 0; r < v.size(); r += static_cast<std::size_t>(width)) {
    double n = 0;
    for (std::int64_t i = 0; i < width; ++i) n += double(v[r + i]) * v[r + i];
    const float inv = static_cast<float>(1.0 / std::sqrt(n + 1e-12));
    for (std::int64_t i = 0; i < width; ++i) v[r + i] *= inv;
  }
}

// A cache of `blocks` states of one layer, with `padding` bytes after each state and the
// layer `offset` bytes into the block (as when several layers share a page); 0xFF (NaN in every
// dtype) wherever nothing was written.
struct StateCache {
  layout::LayerGeometry layer;
  std::vector<std::byte> bytes;
  StateCache(std::int64_t state_bytes, std::int64_t blocks, std::int64_t offset,
             std::int64_t padding) {
    layer.layer = "test.layer";
    layer.recurrent = true;
    layer.state_bytes = state_bytes;
    layer.offset = offset;
    layer.kernel_page_stride = offset + state_bytes + padding;
    bytes.assign(static_cast<std::size_t>(layer.kernel_page_stride * blocks), std::byte{0xFF});
  }
};

// Max |got - want| over a run's outputs and its tolerance check.
double max_error(std::span<const float> got, const std::vector<double>& want) {
  EXPECT_EQ(got.size(), want.size());
  double e = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    e = std::max(e, std::isfinite(got[i]) ? std::fabs(got[i] - want[i]) : INFINITY);
  }
  return e;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

model::LayerDesc gdn_layer(std::int64_t hk, std::int64_t hv, std::int64_t dk, std::int64_t dv,
                           std::int64_t kernel, int spec, DType conv, DType temporal) {
  model::LayerDesc l;
  l.name = "layers.0";
  l.kind = model::LayerKind::kGdn;
  l.num_q_heads = static_cast<int>(hk);
  l.num_kv_heads = static_cast<int>(hv);
  l.head_size = static_cast<int>(dk);
  l.head_size_v = static_cast<int>(dv);
  l.state = {{"conv", {kernel - 1 + spec, 2 * hk * dk + hv * dv}, conv},
             {"temporal", {hv, dk, dv}, temporal}};
  return l;
}

model::LayerDesc kda_layer(std::int64_t hk, std::int64_t hv, std::int64_t dk, std::int64_t dv,
                           std::int64_t kernel, int spec, DType conv, DType recurrent) {
  model::LayerDesc l;
  l.name = "layers.2";
  l.kind = model::LayerKind::kKda;
  l.num_q_heads = static_cast<int>(hk);
  l.num_kv_heads = static_cast<int>(hv);
  l.head_size = static_cast<int>(dk);
  l.head_size_v = static_cast<int>(dv);
  l.state = {{"q_conv", {kernel - 1 + spec, hk * dk}, conv},
             {"k_conv", {kernel - 1 + spec, hk * dk}, conv},
             {"v_conv", {kernel - 1 + spec, hv * dv}, conv},
             {"recurrent", {hv, dk, dv}, recurrent}};
  return l;
}

model::LayerDesc mamba2_layer(std::int64_t heads, std::int64_t p, std::int64_t n,
                              std::int64_t groups, std::int64_t kernel, int spec, DType conv,
                              DType ssm) {
  model::LayerDesc l;
  l.name = "layers.1";
  l.kind = model::LayerKind::kMamba2;
  l.num_q_heads = l.num_kv_heads = static_cast<int>(heads);
  l.state = {{"conv", {kernel - 1 + spec, heads * p + 2 * groups * n}, conv},
             {"ssm", {heads, p, n}, ssm}};
  return l;
}

// Random distinct slots 1..blocks-1 (0 stays unwritten, like the null block).
std::vector<std::int64_t> random_slots(std::mt19937_64& rng, std::int64_t blocks) {
  std::vector<std::int64_t> s(static_cast<std::size_t>(blocks - 1));
  std::iota(s.begin(), s.end(), 1);
  std::shuffle(s.begin(), s.end(), rng);
  return s;
}

// One request of a checked batch: its slots and its decoded start state.
struct Seq {
  std::int64_t in = 0;
  std::vector<std::int64_t> outs;
  std::int64_t tokens = 1;
  std::vector<float> start;  // the state tensor as the cache holds it
};

// Writes random start states and lays out a batch: request i gets `tokens[i]` tokens and
// either one out slot (in place, or a fresh one) or one checkpoint slot per token.
std::vector<Seq> make_batch(std::mt19937_64& rng, StateCache& cache, const StateTensorPlace& place,
                            const std::vector<std::int64_t>& tokens, bool checkpoints,
                            float magnitude) {
  std::vector<std::int64_t> free = random_slots(rng, 64);
  std::vector<Seq> out;
  for (std::int64_t n : tokens) {
    Seq s;
    s.tokens = n;
    s.in = free.back();
    free.pop_back();
    if (checkpoints) {
      s.outs.push_back(s.in);  // the live state is checkpoint 0, overwritten in place
      for (std::int64_t i = 1; i < n; ++i) {
        s.outs.push_back(free.back());
        free.pop_back();
      }
    } else {
      if (std::bernoulli_distribution(0.5)(rng)) {
        s.outs.push_back(s.in);
      } else {
        s.outs.push_back(free.back());
        free.pop_back();
      }
    }
    write_state(place, cache.layer, cache.bytes, s.in,
                random_values(rng, place.elements, -magnitude, magnitude));
    s.start = read_state(place, cache.layer, cache.bytes, s.in);
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<StateSequence> sequences(const std::vector<Seq>& batch) {
  std::vector<StateSequence> out;
  for (const Seq& s : batch) out.push_back({s.in, s.tokens, s.outs});
  return out;
}

// Compares every request's outputs rows [row0, row0 + tokens) and stored states with a run of
// the reference. `width` is the output elements per token.
void expect_matches(const std::vector<Seq>& batch, const StateCache& cache,
                    const StateTensorPlace& place, std::span<const float> out, std::int64_t width,
                    std::int64_t reduction,
                    const std::function<RecurrentRun(const Seq&, std::int64_t row0)>& reference,
                    const std::string& what) {
  std::int64_t row0 = 0;
  for (const Seq& s : batch) {
    const RecurrentRun want = reference(s, row0);
    const double out_tol = output_tolerance(reduction, s.tokens, want.magnitude);
    const double err = max_error(out.subspan(static_cast<std::size_t>(row0 * width),
                                             static_cast<std::size_t>(s.tokens * width)),
                                 want.out);
    EXPECT_LE(err, out_tol) << what << ": outputs of a request of " << s.tokens << " tokens";
    EXPECT_GT(out_tol, 0);
    for (std::size_t i = 0; i < s.outs.size(); ++i) {
      const std::vector<double>& state = s.outs.size() == 1 ? want.states.back() : want.states[i];
      const std::vector<float> got = read_state(place, cache.layer, cache.bytes, s.outs[i]);
      const double tol =
          state_tolerance(place.dtype, reduction, s.tokens, want.magnitude, max_abs(state));
      EXPECT_LE(max_error(got, state), tol) << what << ": state in out slot " << i;
    }
    row0 += s.tokens;
  }
}

class RecurrentDtypes : public ::testing::TestWithParam<DType> {};

TEST_P(RecurrentDtypes, ConvUpdateMatchesTheReferenceAndKeepsTheLastInputs) {
  std::mt19937_64 rng(11 + static_cast<int>(GetParam()));
  for (int trial = 0; trial < 6; ++trial) {
    const int spec_tokens = trial % 3;
    const std::int64_t kernel = 2 + trial % 3;
    const std::int64_t channels = 8 + 24 * trial;
    const model::LayerDesc l = gdn_layer(1, 2, channels / 4, channels / 4, kernel, spec_tokens,
                                         GetParam(), DType::kFloat32);
    const GdnLayerSpec s = gdn_layer_spec(l, spec_tokens);
    ASSERT_EQ(s.conv.kernel, kernel);
    StateCache cache(model::state_bytes(l), 64, 64 * (trial % 2), 32);
    const bool checkpoints = trial % 2 == 1;
    const std::vector<std::int64_t> tokens = {1, 1 + trial % 4, 5, 2};
    const std::vector<Seq> batch = make_batch(rng, cache, s.conv.place, tokens, checkpoints, 1.0f);
    const std::int64_t total = std::accumulate(tokens.begin(), tokens.end(), std::int64_t{0});
    const std::int64_t ch = s.conv.channels;
    const std::vector<float> x = random_values(rng, total * ch, -1, 1);
    const std::vector<float> w = random_values(rng, ch * kernel, -1, 1);
    const std::vector<float> bias =
        trial % 2 ? random_values(rng, ch, -1, 1) : std::vector<float>{};
    std::vector<float> out(static_cast<std::size_t>(total * ch));
    const auto seqs = sequences(batch);
    conv_update(s.conv, cache.layer, cache.bytes, seqs, ConvInputs{x, w, bias}, out);
    expect_matches(
        batch, cache, s.conv.place, out, ch, kernel,
        [&](const Seq& q, std::int64_t row0) {
          return reference_conv(
              s.conv, q.start, q.tokens,
              ConvInputs{std::span<const float>(x).subspan(static_cast<std::size_t>(row0 * ch),
                                                           static_cast<std::size_t>(q.tokens * ch)),
                         w, bias});
        },
        fmt::format("conv trial {}", trial));
  }
}

TEST_P(RecurrentDtypes, GdnStepMatchesTheReferenceForRandomShapes) {
  std::mt19937_64 rng(23 + static_cast<int>(GetParam()));
  for (int trial = 0; trial < 5; ++trial) {
    const std::int64_t hk = 1 + trial % 2, hv = hk * (1 + trial % 3);
    const std::int64_t dk = 8 << (trial % 3), dv = 16 + 8 * trial;
    const model::LayerDesc l =
        gdn_layer(hk, hv, dk, dv, 4, trial % 3, DType::kBfloat16, GetParam());
    const GdnLayerSpec s = gdn_layer_spec(l, trial % 3);
    StateCache cache(model::state_bytes(l), 64, 0, 128 * (trial % 2));
    const std::vector<std::int64_t> tokens = {1, 3, 1 + trial, 2};
    const std::vector<Seq> batch =
        make_batch(rng, cache, s.gdn.place, tokens, trial % 2 == 1, 0.5f);
    const std::int64_t total = std::accumulate(tokens.begin(), tokens.end(), std::int64_t{0});
    std::vector<float> q = random_values(rng, total * hk * dk, -1, 1);
    std::vector<float> k = random_values(rng, total * hk * dk, -1, 1);
    normalize_rows(q, dk);
    normalize_rows(k, dk);
    const std::vector<float> v = random_values(rng, total * hv * dv, -1, 1);
    const std::vector<float> g = random_values(rng, total * hv, -1.0f, 0.0f);
    const std::vector<float> beta = random_values(rng, total * hv, 0.0f, 1.0f);
    std::vector<float> out(static_cast<std::size_t>(total * hv * dv));
    gdn_step(s.gdn, cache.layer, cache.bytes, sequences(batch), GdnInputs{q, k, v, g, beta}, out);
    const auto rows = [](std::span<const float> a, std::int64_t row0, std::int64_t n,
                         std::int64_t width) {
      return a.subspan(static_cast<std::size_t>(row0 * width), static_cast<std::size_t>(n * width));
    };
    expect_matches(
        batch, cache, s.gdn.place, out, hv * dv, dk,
        [&](const Seq& r, std::int64_t row0) {
          return reference_gdn(
              s.gdn, r.start, r.tokens,
              GdnInputs{rows(q, row0, r.tokens, hk * dk), rows(k, row0, r.tokens, hk * dk),
                        rows(v, row0, r.tokens, hv * dv), rows(g, row0, r.tokens, hv),
                        rows(beta, row0, r.tokens, hv)});
        },
        fmt::format("gdn trial {}", trial));
  }
}

TEST_P(RecurrentDtypes, Mamba2StepMatchesTheReferenceForRandomShapes) {
  std::mt19937_64 rng(37 + static_cast<int>(GetParam()));
  for (int trial = 0; trial < 5; ++trial) {
    const std::int64_t groups = 1 + trial % 2, heads = groups * (2 + trial % 3);
    const std::int64_t p = 8 + 8 * trial, n = 16 << (trial % 3);
    const model::LayerDesc l =
        mamba2_layer(heads, p, n, groups, 4, trial % 2, DType::kBfloat16, GetParam());
    const Mamba2LayerSpec s = mamba2_layer_spec(l, trial % 2);
    ASSERT_EQ(s.ssm.groups, groups);
    StateCache cache(model::state_bytes(l), 64, 16, 0);
    const std::vector<std::int64_t> tokens = {1, 2 + trial, 1};
    const std::vector<Seq> batch =
        make_batch(rng, cache, s.ssm.place, tokens, trial % 2 == 0, 1.0f);
    const std::int64_t total = std::accumulate(tokens.begin(), tokens.end(), std::int64_t{0});
    const std::vector<float> x = random_values(rng, total * heads * p, -1, 1);
    const std::vector<float> dt = random_values(rng, total * heads, -3, 1);
    const std::vector<float> b = random_values(rng, total * groups * n, -1, 1);
    const std::vector<float> c = random_values(rng, total * groups * n, -1, 1);
    const std::vector<float> a = random_values(rng, heads, -4, -0.1f);
    const std::vector<float> d = random_values(rng, heads, -1, 1);
    const std::vector<float> bias = random_values(rng, heads, -1, 1);
    std::vector<float> out(static_cast<std::size_t>(total * heads * p));
    mamba2_step(s.ssm, cache.layer, cache.bytes, sequences(batch),
                Mamba2Inputs{x, dt, b, c, a, d, bias}, out);
    const auto rows = [](std::span<const float> v, std::int64_t row0, std::int64_t nt,
                         std::int64_t width) {
      return v.subspan(static_cast<std::size_t>(row0 * width),
                       static_cast<std::size_t>(nt * width));
    };
    expect_matches(
        batch, cache, s.ssm.place, out, heads * p, n,
        [&](const Seq& r, std::int64_t row0) {
          return reference_mamba2(
              s.ssm, r.start, r.tokens,
              Mamba2Inputs{rows(x, row0, r.tokens, heads * p), rows(dt, row0, r.tokens, heads),
                           rows(b, row0, r.tokens, groups * n), rows(c, row0, r.tokens, groups * n),
                           a, d, bias});
        },
        fmt::format("mamba2 trial {}", trial));
  }
}

// KDA inputs for `tokens` tokens: q and k L2-normalised (Kimi Linear normalises them in the
// kernel call), a log decay per key channel in [lo, 0] with every seventh channel forgetting
// fast (-8 per token: e^-512 over a 64-token chunk, far below float's range).
struct KdaData {
  std::vector<float> q, k, v, g, beta;
  KdaInputs inputs() const { return {q, k, v, g, beta}; }
  KdaInputs first(std::int64_t n, const KdaSpec& s) const {
    auto head = [&](const std::vector<float>& x, std::int64_t width) {
      return std::span<const float>(x).first(static_cast<std::size_t>(n * width));
    };
    const std::int64_t qk = s.num_k_heads * s.k_dim;
    return {head(q, qk), head(k, qk), head(v, s.num_v_heads * s.v_dim),
            head(g, s.num_v_heads * s.k_dim), head(beta, s.num_v_heads)};
  }
};
KdaData kda_data(std::mt19937_64& rng, const KdaSpec& s, std::int64_t tokens, float lo = -1.0f) {
  KdaData d;
  d.q = random_values(rng, tokens * s.num_k_heads * s.k_dim, -1, 1);
  d.k = random_values(rng, tokens * s.num_k_heads * s.k_dim, -1, 1);
  normalize_rows(d.q, s.k_dim);
  normalize_rows(d.k, s.k_dim);
  d.v = random_values(rng, tokens * s.num_v_heads * s.v_dim, -1, 1);
  d.g = random_values(rng, tokens * s.num_v_heads * s.k_dim, lo, 0.0f);
  for (std::size_t i = 0; i < d.g.size(); i += 7) d.g[i] = -8.0f;
  d.beta = random_values(rng, tokens * s.num_v_heads, 0.0f, 1.0f);
  return d;
}

TEST_P(RecurrentDtypes, KdaStepMatchesTheReferenceForRandomShapes) {
  std::mt19937_64 rng(29 + static_cast<int>(GetParam()));
  for (int trial = 0; trial < 5; ++trial) {
    const std::int64_t hk = 1 + trial % 2, hv = hk * (1 + trial % 3);
    const std::int64_t dk = 8 << (trial % 3), dv = 16 + 8 * trial;
    const model::LayerDesc l =
        kda_layer(hk, hv, dk, dv, 4, trial % 3, DType::kBfloat16, GetParam());
    const KdaLayerSpec s = kda_layer_spec(l, trial % 3);
    StateCache cache(model::state_bytes(l), 64, 0, 128 * (trial % 2));
    const std::vector<std::int64_t> tokens = {1, 3, 1 + trial, 2};
    const std::vector<Seq> batch =
        make_batch(rng, cache, s.kda.place, tokens, trial % 2 == 1, 0.5f);
    const std::int64_t total = std::accumulate(tokens.begin(), tokens.end(), std::int64_t{0});
    const KdaData d = kda_data(rng, s.kda, total);
    std::vector<float> out(static_cast<std::size_t>(total * hv * dv));
    kda_step(s.kda, cache.layer, cache.bytes, sequences(batch), d.inputs(), out);
    const auto rows = [](std::span<const float> a, std::int64_t row0, std::int64_t n,
                         std::int64_t width) {
      return a.subspan(static_cast<std::size_t>(row0 * width), static_cast<std::size_t>(n * width));
    };
    expect_matches(
        batch, cache, s.kda.place, out, hv * dv, dk,
        [&](const Seq& r, std::int64_t row0) {
          return reference_kda(
              s.kda, r.start, r.tokens,
              KdaInputs{rows(d.q, row0, r.tokens, hk * dk), rows(d.k, row0, r.tokens, hk * dk),
                        rows(d.v, row0, r.tokens, hv * dv), rows(d.g, row0, r.tokens, hv * dk),
                        rows(d.beta, row0, r.tokens, hv)});
        },
        fmt::format("kda trial {}", trial));
  }
}

INSTANTIATE_TEST_SUITE_P(StateDtypes, RecurrentDtypes,
                         ::testing::Values(DType::kFloat32, DType::kBfloat16, DType::kFloat16),
                         [](const auto& info) { return std::string(to_string(info.param)); });

// GDN inputs for `tokens` tokens of one request.
struct GdnData {
  std::vector<float> q, k, v, g, beta;
  GdnInputs inputs() const { return {q, k, v, g, beta}; }
};
GdnData gdn_data(std::mt19937_64& rng, const GdnSpec& s, std::int64_t tokens) {
  GdnData d;
  d.q = random_values(rng, tokens * s.num_k_heads * s.k_dim, -1, 1);
  d.k = random_values(rng, tokens * s.num_k_heads * s.k_dim, -1, 1);
  normalize_rows(d.q, s.k_dim);
  normalize_rows(d.k, s.k_dim);
  d.v = random_values(rng, tokens * s.num_v_heads * s.v_dim, -1, 1);
  d.g = random_values(rng, tokens * s.num_v_heads, -0.5f, 0.0f);
  d.beta = random_values(rng, tokens * s.num_v_heads, 0.0f, 1.0f);
  return d;
}

TEST(GdnChunkedPrefill, MatchesTheStepAndTheReferenceAcrossChunkBoundaries) {
  std::mt19937_64 rng(5);
  const model::LayerDesc l = gdn_layer(2, 4, 32, 32, 4, 0, DType::kBfloat16, DType::kFloat32);
  const GdnLayerSpec s = gdn_layer_spec(l, 0);
  for (auto [tokens, chunk] : {std::pair<std::int64_t, std::int64_t>{1, 64},
                               {63, 64},
                               {64, 64},
                               {65, 64},
                               {150, 64},
                               {37, 8},
                               {40, 1}}) {
    StateCache cache(model::state_bytes(l), 4, 0, 0);
    const std::vector<float> start = random_values(rng, s.gdn.place.elements, -0.5f, 0.5f);
    write_state(s.gdn.place, cache.layer, cache.bytes, 1, start);
    write_state(s.gdn.place, cache.layer, cache.bytes, 2, start);
    const GdnData d = gdn_data(rng, s.gdn, tokens);
    const std::int64_t width = s.gdn.num_v_heads * s.gdn.v_dim;
    std::vector<float> chunked(static_cast<std::size_t>(tokens * width)), step(chunked.size());
    const std::int64_t one = 1, two = 2;
    const StateSequence a{1, tokens, std::span(&one, 1)}, b{2, tokens, std::span(&two, 1)};
    gdn_chunked_prefill(s.gdn, cache.layer, cache.bytes, std::span(&a, 1), d.inputs(), chunk,
                        chunked);
    gdn_step(s.gdn, cache.layer, cache.bytes, std::span(&b, 1), d.inputs(), step);
    // A float32 state holds `start` exactly.
    const RecurrentRun want = reference_gdn(s.gdn, start, tokens, d.inputs());
    const double tol = output_tolerance(s.gdn.k_dim, tokens, want.magnitude);
    const std::string what = fmt::format("{} tokens in chunks of {}", tokens, chunk);
    EXPECT_LE(max_error(chunked, want.out), tol) << what;
    EXPECT_LE(max_error(step, want.out), tol) << what;
    const std::vector<float> got = read_state(s.gdn.place, cache.layer, cache.bytes, 1);
    EXPECT_LE(max_error(got, want.states.back()),
              state_tolerance(DType::kFloat32, s.gdn.k_dim, tokens, want.magnitude,
                              max_abs(want.states.back())))
        << what;
  }
}

// The chunked form against the step and the reference, with gates that forget fast on some
// channels (a naive e^{-G_s} would overflow) and slowly on others, and with GVA heads.
TEST(KdaChunkedPrefill, MatchesTheStepAndTheReferenceAcrossChunkBoundaries) {
  std::mt19937_64 rng(6);
  const model::LayerDesc l = kda_layer(2, 4, 32, 24, 4, 0, DType::kBfloat16, DType::kFloat32);
  const KdaLayerSpec s = kda_layer_spec(l, 0);
  for (auto [tokens, chunk] : {std::pair<std::int64_t, std::int64_t>{1, 64},
                               {15, 64},
                               {17, 64},
                               {63, 64},
                               {64, 64},
                               {65, 64},
                               {150, 64},
                               {37, 8},
                               {40, 1},
                               {100, 48}}) {
    StateCache cache(model::state_bytes(l), 4, 0, 0);
    const std::vector<float> start = random_values(rng, s.kda.place.elements, -0.5f, 0.5f);
    write_state(s.kda.place, cache.layer, cache.bytes, 1, start);
    write_state(s.kda.place, cache.layer, cache.bytes, 2, start);
    const KdaData d = kda_data(rng, s.kda, tokens, tokens % 2 ? -0.2f : -3.0f);
    const std::int64_t width = s.kda.num_v_heads * s.kda.v_dim;
    std::vector<float> chunked(static_cast<std::size_t>(tokens * width)), step(chunked.size());
    const std::int64_t one = 1, two = 2;
    const StateSequence a{1, tokens, std::span(&one, 1)}, b{2, tokens, std::span(&two, 1)};
    kda_chunked_prefill(s.kda, cache.layer, cache.bytes, std::span(&a, 1), d.inputs(), chunk,
                        chunked);
    kda_step(s.kda, cache.layer, cache.bytes, std::span(&b, 1), d.inputs(), step);
    const RecurrentRun want = reference_kda(s.kda, start, tokens, d.inputs());
    const double tol = output_tolerance(s.kda.k_dim, tokens, want.magnitude);
    const std::string what = fmt::format("{} tokens in chunks of {}", tokens, chunk);
    EXPECT_LE(max_error(chunked, want.out), tol) << what;
    EXPECT_LE(max_error(step, want.out), tol) << what;
    for (std::int64_t slot : {1, 2}) {
      const std::vector<float> got = read_state(s.kda.place, cache.layer, cache.bytes, slot);
      EXPECT_LE(max_error(got, want.states.back()),
                state_tolerance(DType::kFloat32, s.kda.k_dim, tokens, want.magnitude,
                                max_abs(want.states.back())))
          << what << ", slot " << slot;
    }
  }
}

// A chunked prefill's result is a function of the request's tokens and where its calls start:
// a request alone equals itself inside a batch bit for bit, and (with a float32 state, which a
// store and load keep exactly) one call equals two calls split at a chunk boundary. GDN and KDA.
TEST(ChunkedPrefill, BatchAndSplitsAtChunkBoundariesAreBitIdentical) {
  std::mt19937_64 rng(8);
  const std::int64_t chunk = 64, tokens = 150, split = 128;
  const model::LayerDesc kl = kda_layer(1, 2, 16, 16, 4, 0, DType::kBfloat16, DType::kFloat32);
  const model::LayerDesc gl = gdn_layer(1, 2, 16, 16, 4, 0, DType::kBfloat16, DType::kFloat32);
  const KdaSpec ks = kda_layer_spec(kl, 0).kda;
  const GdnSpec gs = gdn_layer_spec(gl, 0).gdn;
  const KdaData kd = kda_data(rng, ks, tokens + 40);
  const GdnData gd = gdn_data(rng, gs, tokens + 40);
  const std::int64_t width = ks.num_v_heads * ks.v_dim;  // the same for both layers
  for (bool kda : {true, false}) {
    const StateTensorPlace& place = kda ? ks.place : gs.place;
    StateCache cache(model::state_bytes(kda ? kl : gl), 8, 16, 8);
    const std::vector<float> start = random_values(rng, place.elements, -0.5f, 0.5f);
    for (std::int64_t slot = 1; slot <= 4; ++slot)
      write_state(place, cache.layer, cache.bytes, slot, start);
    // Runs `batch` over rows [row0, row0 + its tokens) of the data.
    auto run = [&](std::span<const StateSequence> batch, std::int64_t row0, std::int64_t n) {
      std::vector<float> out(static_cast<std::size_t>(n * width));
      if (kda) {
        const KdaInputs all = kd.inputs();
        auto rows = [&](std::span<const float> x, std::int64_t w) {
          return x.subspan(static_cast<std::size_t>(row0 * w), static_cast<std::size_t>(n * w));
        };
        const std::int64_t qk = ks.num_k_heads * ks.k_dim, hv = ks.num_v_heads;
        kda_chunked_prefill(ks, cache.layer, cache.bytes, batch,
                            {rows(all.q, qk), rows(all.k, qk), rows(all.v, width),
                             rows(all.g, hv * ks.k_dim), rows(all.beta, hv)},
                            chunk, out);
      } else {
        const GdnInputs all = gd.inputs();
        auto rows = [&](std::span<const float> x, std::int64_t w) {
          return x.subspan(static_cast<std::size_t>(row0 * w), static_cast<std::size_t>(n * w));
        };
        const std::int64_t qk = gs.num_k_heads * gs.k_dim, hv = gs.num_v_heads;
        gdn_chunked_prefill(gs, cache.layer, cache.bytes, batch,
                            {rows(all.q, qk), rows(all.k, qk), rows(all.v, width), rows(all.g, hv),
                             rows(all.beta, hv)},
                            chunk, out);
      }
      return out;
    };
    const std::int64_t s1 = 1, s2 = 2, s3 = 3, s4 = 4;
    // Alone: slot 1, all tokens. In a batch: a 40-token request (slot 3) first, then slot 2.
    const StateSequence alone{1, tokens, std::span(&s1, 1)};
    const std::vector<float> a = run(std::span(&alone, 1), 40, tokens);
    const StateSequence pair[] = {{3, 40, std::span(&s3, 1)}, {2, tokens, std::span(&s2, 1)}};
    const std::vector<float> b = run(pair, 0, 40 + tokens);
    // Split: slot 4 over the first `split` tokens, then the rest in a second call.
    const StateSequence first{4, split, std::span(&s4, 1)},
        rest{4, tokens - split, std::span(&s4, 1)};
    std::vector<float> c = run(std::span(&first, 1), 40, split);
    const std::vector<float> c2 = run(std::span(&rest, 1), 40 + split, tokens - split);
    c.insert(c.end(), c2.begin(), c2.end());
    const char* what = kda ? "kda" : "gdn";
    const auto bytes = a.size() * sizeof(float);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data() + 40 * width, bytes)) << what << ": batch";
    EXPECT_EQ(0, std::memcmp(a.data(), c.data(), bytes)) << what << ": split";
    const std::vector<float> sa = read_state(place, cache.layer, cache.bytes, 1);
    for (std::int64_t slot : {2, 4}) {
      const std::vector<float> other = read_state(place, cache.layer, cache.bytes, slot);
      EXPECT_EQ(0, std::memcmp(sa.data(), other.data(), sa.size() * sizeof(float)))
          << what << ": state in slot " << slot;
    }
  }
}

// KDA's checkpoints: the state after draft j is bit for bit a run of j + 1 tokens, for the
// recurrence and each of the three convs, and within tolerance of the reference.
TEST(RecurrentCheckpoints, KdaCheckpointJEqualsRunningJPlusOneTokens) {
  std::mt19937_64 rng(19);
  const int spec_tokens = 3;
  const std::int64_t n = spec_tokens + 1;
  const model::LayerDesc l =
      kda_layer(2, 2, 16, 16, 4, spec_tokens, DType::kBfloat16, DType::kBfloat16);
  const KdaLayerSpec s = kda_layer_spec(l, spec_tokens);
  std::vector<std::int64_t> outs(static_cast<std::size_t>(n));
  std::iota(outs.begin(), outs.end(), 1);
  const StateSequence verify{1, n, outs};
  const KdaData d = kda_data(rng, s.kda, n);
  StateCache c(model::state_bytes(l), n + 2, 32, 16);
  const std::vector<float> start = random_values(rng, s.kda.place.elements, -1, 1);
  const std::int64_t plain_slot = n + 1;
  const ConvSpec* convs[] = {&s.q_conv, &s.k_conv, &s.v_conv};
  std::vector<std::vector<float>> conv_starts, xs;
  for (const ConvSpec* cs : convs) {
    conv_starts.push_back(random_values(rng, cs->place.elements, -1, 1));
    xs.push_back(random_values(rng, n * cs->channels, -1, 1));
  }
  const std::vector<float> w = random_values(rng, s.q_conv.channels * s.q_conv.kernel, -1, 1);
  auto reset = [&] {
    for (std::int64_t slot : {std::int64_t{1}, plain_slot}) {
      write_state(s.kda.place, c.layer, c.bytes, slot, start);
      for (std::size_t i = 0; i < 3; ++i) {
        write_state(convs[i]->place, c.layer, c.bytes, slot, conv_starts[i]);
      }
    }
  };
  const std::int64_t width = s.kda.num_v_heads * s.kda.v_dim;
  for (std::int64_t j = 0; j < n; ++j) {
    reset();
    const StateSequence plain{plain_slot, j + 1, std::span(&plain_slot, 1)};
    std::vector<float> vo(static_cast<std::size_t>(n * width)),
        po(static_cast<std::size_t>((j + 1) * width));
    kda_step(s.kda, c.layer, c.bytes, std::span(&verify, 1), d.inputs(), vo);
    kda_step(s.kda, c.layer, c.bytes, std::span(&plain, 1), d.first(j + 1, s.kda), po);
    EXPECT_EQ(0, std::memcmp(vo.data(), po.data(), po.size() * sizeof(float))) << "outputs " << j;
    const std::vector<float> cp = read_state(s.kda.place, c.layer, c.bytes, outs[j]);
    const std::vector<float> pl = read_state(s.kda.place, c.layer, c.bytes, plain_slot);
    EXPECT_EQ(0, std::memcmp(cp.data(), pl.data(), cp.size() * sizeof(float))) << "state " << j;
    const RecurrentRun want =
        reference_kda(s.kda, stored_values(DType::kBfloat16, start, 1.0f), n, d.inputs());
    const auto& sj = want.states[static_cast<std::size_t>(j)];
    EXPECT_LE(max_error(cp, sj),
              state_tolerance(DType::kBfloat16, s.kda.k_dim, n, want.magnitude, max_abs(sj)));
    for (std::size_t i = 0; i < 3; ++i) {
      const ConvSpec& cs = *convs[i];
      const std::vector<float> wi(w.begin(), w.begin() + cs.channels * cs.kernel);
      std::vector<float> cvo(static_cast<std::size_t>(n * cs.channels)),
          cpo(static_cast<std::size_t>((j + 1) * cs.channels));
      conv_update(cs, c.layer, c.bytes, std::span(&verify, 1), {xs[i], wi, {}}, cvo);
      conv_update(cs, c.layer, c.bytes, std::span(&plain, 1),
                  {std::span<const float>(xs[i]).first(cpo.size()), wi, {}}, cpo);
      EXPECT_EQ(0, std::memcmp(cvo.data(), cpo.data(), cpo.size() * sizeof(float)))
          << "conv " << i << " outputs " << j;
      const std::vector<float> a = read_state(cs.place, c.layer, c.bytes, outs[j]);
      const std::vector<float> b = read_state(cs.place, c.layer, c.bytes, plain_slot);
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
          << "conv " << i << " state " << j;
    }
    // The three convs and the recurrence own disjoint bytes of the state: the recurrence's
    // checkpoint is untouched by the convs that ran after it.
    EXPECT_EQ(read_state(s.kda.place, c.layer, c.bytes, outs[j]), cp) << "state " << j;
  }
}

// Kimi Linear's gate against the formula in double: g = -exp(A_log[h]) softplus(x + dt_bias).
TEST(KdaGate, MatchesTheFormulaPerHeadAndChannel) {
  std::mt19937_64 rng(4);
  const std::int64_t heads = 3, dk = 8, tokens = 5;
  std::vector<float> raw = random_values(rng, tokens * heads * dk, -30, 30);
  raw[0] = 25.0f;  // past softplus's threshold of 20 (identity there)
  const std::vector<float> a_log = random_values(rng, heads, 0, 2.8f);  // A in [1, 16]
  const std::vector<float> bias = random_values(rng, heads * dk, -2, 2);
  std::vector<float> g(raw.size());
  kda_gate(heads, dk, raw, a_log, bias, g);
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t h = 0; h < heads; ++h) {
      for (std::int64_t i = 0; i < dk; ++i) {
        const std::size_t at = static_cast<std::size_t>((t * heads + h) * dk + i);
        const double x = double(raw[at]) + bias[static_cast<std::size_t>(h * dk + i)];
        const double want =
            -std::exp(double(a_log[static_cast<std::size_t>(h)])) * std::log1p(std::exp(x));
        EXPECT_NEAR(g[at], want, 4e-7 * std::max(1.0, std::fabs(want))) << at;
        EXPECT_LE(g[at], 0.0f);
      }
    }
  }
  mixkv::testing::expect_error([&] { kda_gate(heads, dk, raw, a_log, {}, std::span(g).first(3)); },
                               ErrorCode::kInvalidInput, {"KDA gate", "3 heads"});
}

// A speculative verify over n tokens writes n states; checkpoint j is bit for bit the state a
// run of the first j + 1 tokens leaves, and its outputs are the verify's first j + 1 outputs.
TEST(RecurrentCheckpoints, CheckpointJEqualsRunningJPlusOneTokens) {
  std::mt19937_64 rng(17);
  const int spec_tokens = 4;
  const std::int64_t n = spec_tokens + 1;
  const model::LayerDesc gl =
      gdn_layer(2, 4, 16, 24, 4, spec_tokens, DType::kBfloat16, DType::kBfloat16);
  const model::LayerDesc ml =
      mamba2_layer(4, 8, 16, 2, 4, spec_tokens, DType::kBfloat16, DType::kFloat16);
  const GdnLayerSpec g = gdn_layer_spec(gl, spec_tokens);
  const Mamba2LayerSpec m = mamba2_layer_spec(ml, spec_tokens);
  for (std::int64_t j = 0; j < n; ++j) {
    // Slots 1..n: the verify's checkpoints (1 is also the live state); n + 1: the plain run.
    std::vector<std::int64_t> outs(static_cast<std::size_t>(n));
    std::iota(outs.begin(), outs.end(), 1);
    const std::int64_t plain_slot = n + 1;
    const StateSequence verify{1, n, outs};
    const StateSequence plain{plain_slot, j + 1, std::span(&plain_slot, 1)};
    auto expect_same = [&](const StateCache& c, const StateTensorPlace& place,
                           const std::vector<float>& vo, const std::vector<float>& po,
                           std::int64_t width, const char* what) {
      const std::int64_t at = c.layer.offset +
                              outs[static_cast<std::size_t>(j)] * c.layer.kernel_page_stride +
                              place.offset;
      const std::int64_t pat =
          c.layer.offset + plain_slot * c.layer.kernel_page_stride + place.offset;
      const auto len = static_cast<std::size_t>(storage_bytes(place.dtype, place.elements));
      EXPECT_EQ(0, std::memcmp(c.bytes.data() + at, c.bytes.data() + pat, len))
          << what << ": checkpoint " << j;
      EXPECT_EQ(0, std::memcmp(vo.data(), po.data(),
                               static_cast<std::size_t>((j + 1) * width) * sizeof(float)))
          << what << ": outputs up to " << j;
    };
    {
      StateCache c(model::state_bytes(gl), n + 2, 32, 16);
      const std::vector<float> start = random_values(rng, g.conv.place.elements, -1, 1);
      write_state(g.conv.place, c.layer, c.bytes, 1, start);
      write_state(g.conv.place, c.layer, c.bytes, plain_slot, start);
      const std::int64_t ch = g.conv.channels;
      const std::vector<float> x = random_values(rng, n * ch, -1, 1);
      const std::vector<float> w = random_values(rng, ch * g.conv.kernel, -1, 1);
      std::vector<float> vo(static_cast<std::size_t>(n * ch)),
          po(static_cast<std::size_t>((j + 1) * ch));
      conv_update(g.conv, c.layer, c.bytes, std::span(&verify, 1), {x, w, {}}, vo);
      conv_update(g.conv, c.layer, c.bytes, std::span(&plain, 1),
                  {std::span<const float>(x).first(static_cast<std::size_t>((j + 1) * ch)), w, {}},
                  po);
      expect_same(c, g.conv.place, vo, po, ch, "conv");
      // The conv checkpoint also holds the inputs themselves: its last row is token j's input.
      const std::vector<float> cp =
          read_state(g.conv.place, c.layer, c.bytes, outs[static_cast<std::size_t>(j)]);
      const std::vector<float> xj =
          stored_values(DType::kBfloat16,
                        std::span<const float>(x).subspan(static_cast<std::size_t>(j * ch),
                                                          static_cast<std::size_t>(ch)),
                        1.0f);
      EXPECT_TRUE(std::equal(xj.begin(), xj.end(), cp.end() - ch));
    }
    {
      StateCache c(model::state_bytes(gl), n + 2, 0, 0);
      const std::vector<float> start = random_values(rng, g.gdn.place.elements, -1, 1);
      write_state(g.gdn.place, c.layer, c.bytes, 1, start);
      write_state(g.gdn.place, c.layer, c.bytes, plain_slot, start);
      const GdnData d = gdn_data(rng, g.gdn, n);
      const std::int64_t width = g.gdn.num_v_heads * g.gdn.v_dim;
      const GdnData first{
          std::vector<float>(d.q.begin(), d.q.begin() + (j + 1) * g.gdn.num_k_heads * g.gdn.k_dim),
          std::vector<float>(d.k.begin(), d.k.begin() + (j + 1) * g.gdn.num_k_heads * g.gdn.k_dim),
          std::vector<float>(d.v.begin(), d.v.begin() + (j + 1) * width),
          std::vector<float>(d.g.begin(), d.g.begin() + (j + 1) * g.gdn.num_v_heads),
          std::vector<float>(d.beta.begin(), d.beta.begin() + (j + 1) * g.gdn.num_v_heads)};
      std::vector<float> vo(static_cast<std::size_t>(n * width)),
          po(static_cast<std::size_t>((j + 1) * width));
      gdn_step(g.gdn, c.layer, c.bytes, std::span(&verify, 1), d.inputs(), vo);
      gdn_step(g.gdn, c.layer, c.bytes, std::span(&plain, 1), first.inputs(), po);
      expect_same(c, g.gdn.place, vo, po, width, "gdn");
      // And the checkpoint is the reference's state after token j, within tolerance.
      const RecurrentRun want =
          reference_gdn(g.gdn, stored_values(DType::kBfloat16, start, 1.0f), n, d.inputs());
      const std::vector<float> cp =
          read_state(g.gdn.place, c.layer, c.bytes, outs[static_cast<std::size_t>(j)]);
      const auto& sj = want.states[static_cast<std::size_t>(j)];
      EXPECT_LE(max_error(cp, sj),
                state_tolerance(DType::kBfloat16, g.gdn.k_dim, n, want.magnitude, max_abs(sj)));
    }
    {
      StateCache c(model::state_bytes(ml), n + 2, 0, 64);
      const std::vector<float> start = random_values(rng, m.ssm.place.elements, -1, 1);
      write_state(m.ssm.place, c.layer, c.bytes, 1, start);
      write_state(m.ssm.place, c.layer, c.bytes, plain_slot, start);
      const std::int64_t h = m.ssm.heads, p = m.ssm.head_dim, ns = m.ssm.state_size,
                         gr = m.ssm.groups;
      const std::vector<float> x = random_values(rng, n * h * p, -1, 1);
      const std::vector<float> dt = random_values(rng, n * h, -2, 1);
      const std::vector<float> b = random_values(rng, n * gr * ns, -1, 1);
      const std::vector<float> cc = random_values(rng, n * gr * ns, -1, 1);
      const std::vector<float> a = random_values(rng, h, -2, -0.5f);
      const std::vector<float> dd = random_values(rng, h, -1, 1);
      const std::vector<float> bias = random_values(rng, h, -1, 1);
      auto head = [&](const std::vector<float>& v, std::int64_t width) {
        return std::span<const float>(v).first(static_cast<std::size_t>((j + 1) * width));
      };
      std::vector<float> vo(static_cast<std::size_t>(n * h * p)),
          po(static_cast<std::size_t>((j + 1) * h * p));
      mamba2_step(m.ssm, c.layer, c.bytes, std::span(&verify, 1), {x, dt, b, cc, a, dd, bias}, vo);
      mamba2_step(m.ssm, c.layer, c.bytes, std::span(&plain, 1),
                  {head(x, h * p), head(dt, h), head(b, gr * ns), head(cc, gr * ns), a, dd, bias},
                  po);
      expect_same(c, m.ssm.place, vo, po, h * p, "mamba2");
    }
  }
}

// States are stored and read back exactly as the conversion module converts (the kernels have
// their own fast loops for bf16 and float32): random values, ties, huge values, infinities, NaN.
TEST(RecurrentStateBytes, StateWritesAndReadsAreTheConversionModulesBitForBit) {
  std::mt19937_64 rng(9);
  for (DType dtype : {DType::kBfloat16, DType::kFloat32, DType::kFloat16, DType::kFp8E4m3}) {
    std::vector<float> values = random_values(rng, 1000, -4, 4);
    std::uniform_int_distribution<std::uint32_t> bits;
    for (int i = 0; i < 200; ++i) values.push_back(std::bit_cast<float>(bits(rng)));
    for (float x : {0.0f, -0.0f, INFINITY, -INFINITY, NAN, std::bit_cast<float>(0x7F800001u),
                    std::bit_cast<float>(0xFFA00000u), 3.4e38f, -3.4e38f, 1.0f + 0x1p-8f,
                    1.0f + 0x1p-8f + 0x1p-16f, 1e-40f}) {
      values.push_back(x);
    }
    const StateTensorPlace place{8, static_cast<std::int64_t>(values.size()), dtype};
    StateCache cache(place.offset + storage_bytes(dtype, place.elements), 3, 4, 2);
    write_state(place, cache.layer, cache.bytes, 2, values);
    std::vector<std::byte> want(static_cast<std::size_t>(storage_bytes(dtype, place.elements)));
    encode_row(dtype, values, 1.0f, want);
    const std::int64_t at = cache.layer.offset + 2 * cache.layer.kernel_page_stride + place.offset;
    EXPECT_EQ(0, std::memcmp(cache.bytes.data() + at, want.data(), want.size()))
        << to_string(dtype);
    std::vector<float> back(values.size());
    decode_row(dtype, want, 1.0f, back);
    const std::vector<float> got = read_state(place, cache.layer, cache.bytes, 2);
    EXPECT_EQ(0, std::memcmp(got.data(), back.data(), back.size() * sizeof(float)))
        << to_string(dtype);
  }
}

// With the run-time manager's tables over a real plan: a speculative verify over the last token
// and three drafts writes the checkpoints into the request's GDN table, commit() with two accepted
// drafts makes checkpoint 2 the live state, and that state is byte for byte what running the
// last token and the two accepted drafts from the old live state gives.
TEST(RecurrentCheckpoints, CommitMakesTheAcceptedCheckpointTheLiveState) {
  model::DescribeOptions o;
  o.tp = 4;
  o.num_spec_tokens = 3;
  const model::ModelDesc desc = mixkv::testing::describe_builtin("qwen3-next-80b-a3b", {}, o);
  plan::PlanOptions po;
  po.policy = plan::Policy::kVllm;
  po.backend = backend::Backend::kCpu;
  po.memory_bytes = std::int64_t{64} << 20;
  po.max_model_len = 1024;
  const plan::CachePlan plan = plan::make_plan(desc, po);
  const layout::Geometry geometry =
      layout::make_geometry(desc, plan, attn::build_attention_groups(desc, plan));
  const model::LayerDesc& layer = *mixkv::testing::layers_of(desc, model::LayerKind::kGdn).front();
  const layout::LayerGeometry& g = geometry.layer(layer.name);
  const GdnSpec spec = gdn_layer_spec(layer, desc.num_spec_tokens).gdn;
  std::vector<std::byte> tensor(
      static_cast<std::size_t>(plan.tensors.at(static_cast<std::size_t>(g.tensor)).bytes),
      std::byte{0xFF});

  cache::KvCacheManager m(plan, desc.num_spec_tokens);
  const cache::RequestId id{1};
  std::vector<cache::TokenId> prompt(40);
  std::iota(prompt.begin(), prompt.end(), 1);
  m.add_request(id, prompt);
  ASSERT_TRUE(m.admit(id, 3).has_value());
  m.commit(id, 40, std::vector<cache::TokenId>{100});
  auto table = [&] {
    std::vector<std::int64_t> t;
    for (cache::BlockId b : m.block_table(id, g.kv_cache_group)) t.push_back(b.value());
    return t;
  };
  std::mt19937_64 rng(21);
  const std::vector<float> start = random_values(rng, spec.place.elements, -0.5f, 0.5f);
  write_state(spec.place, g, tensor, table()[0], start);  // what the prefill left

  ASSERT_TRUE(m.allocate(id, 1, 3));
  const std::vector<std::int64_t> verify_table = table();
  ASSERT_EQ(verify_table.size(), 4u);
  const std::vector<std::byte> before = tensor;
  const GdnData d = gdn_data(rng, spec, 4);
  std::vector<float> out(static_cast<std::size_t>(4 * spec.num_v_heads * spec.v_dim));
  const StateSequence verify{verify_table[0], 4, verify_table};
  gdn_step(spec, g, tensor, std::span(&verify, 1), d.inputs(), out);
  m.commit(id, 3, std::vector<cache::TokenId>{101, 102, 103}, 2);
  ASSERT_EQ(m.check_invariants(), "");
  const std::int64_t live = table()[0];
  EXPECT_EQ(live, verify_table[2]);

  // The last token and the two accepted drafts, from the old live state, on a copy of the cache.
  std::vector<std::byte> replay = before;
  const std::int64_t old_live = verify_table[0];
  const StateSequence three{old_live, 3, std::span(&old_live, 1)};
  const auto first3 = [&](const std::vector<float>& v, std::int64_t width) {
    return std::span<const float>(v).first(static_cast<std::size_t>(3 * width));
  };
  const std::int64_t qw = spec.num_k_heads * spec.k_dim, vw = spec.num_v_heads * spec.v_dim;
  std::vector<float> out3(static_cast<std::size_t>(3 * vw));
  gdn_step(spec, g, replay, std::span(&three, 1),
           GdnInputs{first3(d.q, qw), first3(d.k, qw), first3(d.v, vw),
                     first3(d.g, spec.num_v_heads), first3(d.beta, spec.num_v_heads)},
           out3);
  const std::vector<float> a = read_state(spec.place, g, tensor, live);
  const std::vector<float> b = read_state(spec.place, g, replay, old_live);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

TEST(RecurrentLayerSpec, QwenNextAndNemotronShapesPerRank) {
  model::DescribeOptions o;
  o.tp = 4;
  const model::ModelDesc next = mixkv::testing::describe_builtin("qwen3-next-80b-a3b", {}, o);
  const auto gdn = mixkv::testing::layers_of(next, model::LayerKind::kGdn);
  ASSERT_FALSE(gdn.empty());
  const GdnLayerSpec g = gdn_layer_spec(*gdn.front(), next.num_spec_tokens);
  // Qwen3-Next: 16 key / 32 value heads of 128, conv width 4 (config.json), split over 4 ranks.
  EXPECT_EQ(g.gdn.num_k_heads, 4);
  EXPECT_EQ(g.gdn.num_v_heads, 8);
  EXPECT_EQ(g.gdn.k_dim, 128);
  EXPECT_EQ(g.gdn.v_dim, 128);
  EXPECT_EQ(g.conv.kernel, 4);
  EXPECT_EQ(g.conv.channels, 2 * 4 * 128 + 8 * 128);
  // The temporal state follows the conv state inside the layer's state.
  EXPECT_EQ(g.gdn.place.offset, storage_bytes(g.conv.place.dtype, g.conv.place.elements));
  EXPECT_EQ(g.gdn.place.offset + storage_bytes(g.gdn.place.dtype, g.gdn.place.elements),
            model::state_bytes(*gdn.front()));

  const model::ModelDesc nemo = mixkv::testing::describe_builtin("nemotron-h-8b");
  const auto m2 = mixkv::testing::layers_of(nemo, model::LayerKind::kMamba2);
  ASSERT_FALSE(m2.empty());
  const Mamba2LayerSpec m = mamba2_layer_spec(*m2.front(), nemo.num_spec_tokens);
  EXPECT_GT(m.ssm.groups, 0);
  EXPECT_EQ(m.ssm.heads % m.ssm.groups, 0);
  EXPECT_EQ(m.conv.channels, m.ssm.heads * m.ssm.head_dim + 2 * m.ssm.groups * m.ssm.state_size);
}

// Kimi-Linear-48B: 32 KDA heads of 128, short conv width 4 (config.json), 8 heads per rank at TP 4;
// the three conv states, then the recurrence, in the layer's state order.
TEST(RecurrentLayerSpec, KimiLinearShapesPerRank) {
  model::DescribeOptions o;
  o.tp = 4;
  o.num_spec_tokens = 2;
  const model::ModelDesc kimi = mixkv::testing::describe_builtin("kimi-linear-48b", {}, o);
  const auto kda = mixkv::testing::layers_of(kimi, model::LayerKind::kKda);
  ASSERT_EQ(kda.size(), 20u);
  const KdaLayerSpec s = kda_layer_spec(*kda.front(), kimi.num_spec_tokens);
  EXPECT_EQ(s.kda.num_k_heads, 8);
  EXPECT_EQ(s.kda.num_v_heads, 8);
  EXPECT_EQ(s.kda.k_dim, 128);
  EXPECT_EQ(s.kda.v_dim, 128);
  EXPECT_FLOAT_EQ(s.kda.scale, 1.0f / std::sqrt(128.0f));
  for (const ConvSpec* c : {&s.q_conv, &s.k_conv, &s.v_conv}) {
    EXPECT_EQ(c->kernel, 4);
    EXPECT_EQ(c->rows, 3 + 2);
    EXPECT_EQ(c->channels, 8 * 128);
  }
  const std::int64_t conv_bytes = storage_bytes(s.q_conv.place.dtype, s.q_conv.place.elements);
  EXPECT_EQ(s.q_conv.place.offset, 0);
  EXPECT_EQ(s.k_conv.place.offset, conv_bytes);
  EXPECT_EQ(s.v_conv.place.offset, 2 * conv_bytes);
  EXPECT_EQ(s.kda.place.offset, 3 * conv_bytes);
  EXPECT_EQ(s.kda.place.offset + storage_bytes(s.kda.place.dtype, s.kda.place.elements),
            model::state_bytes(*kda.front()));
  mixkv::testing::expect_error([&] { gdn_layer_spec(*kda.front(), 2); }, ErrorCode::kInvalidInput,
                               {"not a Gated DeltaNet layer"});
}

TEST(RecurrentBadInput, SlotsShapesAndKindsAreRejectedWithTheirNames) {
  const model::LayerDesc l = gdn_layer(1, 2, 8, 8, 4, 2, DType::kBfloat16, DType::kFloat32);
  const GdnLayerSpec s = gdn_layer_spec(l, 2);
  StateCache cache(model::state_bytes(l), 4, 0, 0);
  std::mt19937_64 rng(3);
  const GdnData d = gdn_data(rng, s.gdn, 2);
  std::vector<float> out(static_cast<std::size_t>(2 * 2 * 8));
  using mixkv::testing::expect_error;
  auto run = [&](std::int64_t in, std::vector<std::int64_t> outs, std::int64_t tokens = 2) {
    const StateSequence q{in, tokens, outs};
    gdn_step(s.gdn, cache.layer, cache.bytes, std::span(&q, 1), d.inputs(), out);
  };
  expect_error([&] { run(4, {1}); }, ErrorCode::kInvalidInput, {"test.layer", "slot 4", "outside"});
  expect_error([&] { run(-1, {1}); }, ErrorCode::kInvalidInput, {"slot -1", "negative"});
  expect_error([&] { run(1, {1, 2, 3}); }, ErrorCode::kInvalidInput, {"3 out slots for 2 tokens"});
  expect_error([&] { run(1, {1}, 3); }, ErrorCode::kInvalidInput, {"q has"});
  expect_error(
      [&] {
        const std::int64_t outs[] = {1, 2};
        const StateSequence q{1, 2, outs};
        gdn_chunked_prefill(s.gdn, cache.layer, cache.bytes, std::span(&q, 1), d.inputs(), 64, out);
      },
      ErrorCode::kInvalidInput, {"2 out slots", "give 1 (final state)"});
  layout::LayerGeometry attention = cache.layer;
  attention.recurrent = false;
  expect_error(
      [&] {
        const std::int64_t one = 1;
        const StateSequence q{1, 2, std::span(&one, 1)};
        gdn_step(s.gdn, attention, cache.bytes, std::span(&q, 1), d.inputs(), out);
      },
      ErrorCode::kInvalidInput, {"attention layer"});
  layout::LayerGeometry small = cache.layer;
  small.state_bytes -= 4;
  expect_error([&] { read_state(s.gdn.place, small, cache.bytes, 1); }, ErrorCode::kInvalidInput,
               {"does not fit the layer's"});
  model::LayerDesc wrong = l;
  wrong.state[0].shape[1] += 1;
  expect_error([&] { gdn_layer_spec(wrong, 2); }, ErrorCode::kInvalidInput,
               {"layers.0", "conv state has"});
  expect_error([&] { mamba2_layer_spec(l, 2); }, ErrorCode::kInvalidInput,
               {"layers.0", "not a Mamba2 layer"});
  model::LayerDesc missing = l;
  missing.state.pop_back();
  expect_error([&] { gdn_layer_spec(missing, 2); }, ErrorCode::kInvalidInput,
               {"no 'temporal' state tensor"});
}

TEST(RecurrentBadInput, KdaGatesShapesAndStatesAreRejectedWithTheirNames) {
  const model::LayerDesc l = kda_layer(2, 2, 8, 8, 4, 1, DType::kBfloat16, DType::kFloat32);
  const KdaLayerSpec s = kda_layer_spec(l, 1);
  StateCache cache(model::state_bytes(l), 4, 0, 0);
  std::mt19937_64 rng(3);
  const KdaData d = kda_data(rng, s.kda, 2);
  std::vector<float> out(static_cast<std::size_t>(2 * 2 * 8));
  using mixkv::testing::expect_error;
  const std::int64_t one = 1;
  const StateSequence q{1, 2, std::span(&one, 1)};
  KdaInputs per_head = d.inputs();
  per_head.g = per_head.g.first(4);  // one gate per head and token, GDN's shape
  expect_error([&] { kda_step(s.kda, cache.layer, cache.bytes, std::span(&q, 1), per_head, out); },
               ErrorCode::kInvalidInput, {"test.layer", "one log decay per key channel"});
  expect_error(
      [&] {
        kda_chunked_prefill(s.kda, cache.layer, cache.bytes, std::span(&q, 1), d.inputs(), 0, out);
      },
      ErrorCode::kInvalidInput, {"chunk size 0"});
  model::LayerDesc wrong = l;
  wrong.state[2].shape[1] += 8;
  expect_error([&] { kda_layer_spec(wrong, 1); }, ErrorCode::kInvalidInput,
               {"layers.2", "conv states of 16/16/24 channels"});
  model::LayerDesc missing = l;
  missing.state.erase(missing.state.begin() + 1);
  expect_error([&] { kda_layer_spec(missing, 1); }, ErrorCode::kInvalidInput,
               {"no 'k_conv' state tensor"});
  expect_error(
      [&] { kda_layer_spec(gdn_layer(1, 2, 8, 8, 4, 1, DType::kBfloat16, DType::kFloat32), 1); },
      ErrorCode::kInvalidInput, {"layers.0", "not a Kimi Delta Attention layer"});
}

}  // namespace
}  // namespace mixkv::kernels
