#include "mixkv/kernels/recurrent_reference.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "mixkv/core/error.hpp"
#include "mixkv/kernels/convert.hpp"

namespace mixkv::kernels {
namespace {

void check(std::string_view what, std::size_t got, std::int64_t want) {
  if (static_cast<std::int64_t>(got) != want) {
    throw_invalid(
        fmt::format("recurrent reference: {} has {} elements, expected {}", what, got, want));
  }
}

}  // namespace

RecurrentRun reference_conv(const ConvSpec& spec, std::span<const float> state,
                            std::int64_t num_tokens, const ConvInputs& in, bool every_state) {
  const std::int64_t ch = spec.channels, kw = spec.kernel, rows = spec.rows;
  check("conv state", state.size(), rows * ch);
  check("conv x", in.x.size(), num_tokens * ch);
  check("conv weight", in.weight.size(), ch * kw);
  if (!in.bias.empty()) check("conv bias", in.bias.size(), ch);
  // The whole input stream: the state's rows, then the new tokens.
  std::vector<double> stream(state.begin(), state.end());
  stream.insert(stream.end(), in.x.begin(), in.x.end());
  RecurrentRun r;
  for (std::int64_t t = 0; t < num_tokens; ++t) {
    const std::int64_t now = rows + t;  // stream row of token t
    for (std::int64_t c = 0; c < ch; ++c) {
      double y = in.bias.empty() ? 0.0 : in.bias[c];
      double mag = std::fabs(y);
      for (std::int64_t j = 0; j < kw; ++j) {
        const double term = in.weight[c * kw + j] * stream[(now - (kw - 1) + j) * ch + c];
        y += term;
        mag += std::fabs(term);
      }
      if (spec.silu) y = y / (1.0 + std::exp(-y));
      r.out.push_back(y);
      r.magnitude = std::max(r.magnitude, mag);
    }
    if (every_state || t == num_tokens - 1) {
      r.states.emplace_back(stream.begin() + (t + 1) * ch, stream.begin() + (now + 1) * ch);
      r.magnitude = std::max(r.magnitude, max_abs(r.states.back()));
    }
  }
  return r;
}

// The gated delta rule per token, one decay per key channel (KDA); GDN's single decay per head is
// the case of equal channels. Column j of a head's state, S[h][.][j], evolves on its own (token t
// reads only its own column, and k_t, q_t, v_t[j]), so the loops run head, block of kColumns
// columns, token: the block stays in the first-level cache through every token instead of the
// whole state streaming through memory once per token, and the innermost loop runs over the
// block's columns, independent sums each added in the order of i as the rule is written (so the
// compiler can vectorise it without reassociating anything: the same values as a loop per column).
RecurrentRun reference_kda(const KdaSpec& spec, std::span<const float> state,
                           std::int64_t num_tokens, const KdaInputs& in, bool every_state) {
  const std::int64_t hv = spec.num_v_heads, hk = spec.num_k_heads, dk = spec.k_dim, dv = spec.v_dim;
  check("KDA state", state.size(), hv * dk * dv);
  check("q", in.q.size(), num_tokens * hk * dk);
  check("k", in.k.size(), num_tokens * hk * dk);
  check("v", in.v.size(), num_tokens * hv * dv);
  check("g", in.g.size(), num_tokens * hv * dk);
  check("beta", in.beta.size(), num_tokens * hv);
  const auto at = [&](std::int64_t h, std::int64_t i, std::int64_t j) {
    return static_cast<std::size_t>((h * dk + i) * dv + j);
  };
  const auto tokens = static_cast<std::size_t>(num_tokens);
  RecurrentRun r;
  r.out.assign(tokens * static_cast<std::size_t>(hv * dv), 0.0);
  r.states.assign(every_state ? tokens : std::min<std::size_t>(tokens, 1),
                  std::vector<double>(state.size()));
  constexpr std::int64_t kColumns = 16;
  const double scale = spec.scale;
  std::vector<double> decay(tokens * static_cast<std::size_t>(dk));    // head h's, [token][i]
  std::vector<double> block(static_cast<std::size_t>(dk * kColumns));  // [i][column]
  for (std::int64_t h = 0; h < hv; ++h) {
    const std::int64_t kh = h / (hv / hk);
    for (std::int64_t t = 0; t < num_tokens; ++t) {
      for (std::int64_t i = 0; i < dk; ++i) {
        decay[t * dk + i] = std::exp(static_cast<double>(in.g[(t * hv + h) * dk + i]));
      }
    }
    for (std::int64_t j0 = 0; j0 < dv; j0 += kColumns) {
      // A last block narrower than kColumns runs as zero columns with zero values beyond dv: they
      // stay zero and add nothing to the magnitude.
      const std::int64_t width = std::min(kColumns, dv - j0);
      std::fill(block.begin(), block.end(), 0.0);
      for (std::int64_t i = 0; i < dk; ++i) {
        for (std::int64_t c = 0; c < width; ++c) block[i * kColumns + c] = state[at(h, i, j0 + c)];
      }
      for (std::int64_t t = 0; t < num_tokens; ++t) {
        const float* q = in.q.data() + (t * hk + kh) * dk;
        const float* k = in.k.data() + (t * hk + kh) * dk;
        const float* v = in.v.data() + (t * hv + h) * dv + j0;
        const double* d = decay.data() + t * dk;
        const double beta = in.beta[t * hv + h];
        // Decay, then S^T k and its magnitude.
        double sk[kColumns] = {}, mag[kColumns] = {};
        for (std::int64_t c = 0; c < width; ++c) mag[c] = std::fabs(v[c]);
        for (std::int64_t i = 0; i < dk; ++i) {
          double* row = block.data() + i * kColumns;
          const double di = d[i], ki = k[i];
          // Not unrolled by the compiler: a loop over the columns is what it vectorises.
#pragma GCC unroll 1
          for (std::int64_t c = 0; c < kColumns; ++c) {
            row[c] *= di;
            sk[c] += row[c] * ki;
            mag[c] += std::fabs(row[c] * ki);
          }
        }
        double u[kColumns] = {};
        for (std::int64_t c = 0; c < width; ++c) u[c] = beta * (v[c] - sk[c]);
        // The rank-one update, then S^T q and its magnitude.
        double o[kColumns] = {}, omag[kColumns] = {}, most[kColumns] = {};
        for (std::int64_t i = 0; i < dk; ++i) {
          double* row = block.data() + i * kColumns;
          const double ki = k[i], qi = q[i];
#pragma GCC unroll 1
          for (std::int64_t c = 0; c < kColumns; ++c) {
            row[c] += ki * u[c];
            o[c] += row[c] * qi * scale;
            omag[c] += std::fabs(row[c] * qi * scale);
            most[c] = std::max(most[c], std::fabs(row[c]));
          }
        }
        for (std::int64_t c = 0; c < width; ++c) {
          r.out[static_cast<std::size_t>((t * hv + h) * dv + j0 + c)] = o[c];
          r.magnitude = std::max({r.magnitude, mag[c], omag[c], most[c]});
        }
        if (every_state || t == num_tokens - 1) {
          std::vector<double>& s = r.states[every_state ? static_cast<std::size_t>(t) : 0];
          for (std::int64_t i = 0; i < dk; ++i) {
            std::copy_n(block.begin() + i * kColumns, width, s.begin() + at(h, i, j0));
          }
        }
      }
    }
  }
  return r;
}

RecurrentRun reference_gdn(const GdnSpec& spec, std::span<const float> state,
                           std::int64_t num_tokens, const GdnInputs& in, bool every_state) {
  check("g", in.g.size(), num_tokens * spec.num_v_heads);
  std::vector<float> per_channel;
  per_channel.reserve(in.g.size() * static_cast<std::size_t>(spec.k_dim));
  for (float g : in.g) {
    per_channel.insert(per_channel.end(), static_cast<std::size_t>(spec.k_dim), g);
  }
  return reference_kda(spec, state, num_tokens, KdaInputs{in.q, in.k, in.v, per_channel, in.beta},
                       every_state);
}

RecurrentRun reference_mamba2(const Mamba2Spec& spec, std::span<const float> state,
                              std::int64_t num_tokens, const Mamba2Inputs& in, bool every_state) {
  const std::int64_t nh = spec.heads, pd = spec.head_dim, ns = spec.state_size,
                     groups = spec.groups;
  check("Mamba2 state", state.size(), nh * pd * ns);
  check("x", in.x.size(), num_tokens * nh * pd);
  check("dt", in.dt.size(), num_tokens * nh);
  check("B", in.b.size(), num_tokens * groups * ns);
  check("C", in.c.size(), num_tokens * groups * ns);
  check("A", in.a.size(), nh);
  check("D", in.d.size(), nh);
  check("dt_bias", in.dt_bias.size(), nh);
  std::vector<double> s(state.begin(), state.end());
  RecurrentRun r;
  for (std::int64_t t = 0; t < num_tokens; ++t) {
    for (std::int64_t h = 0; h < nh; ++h) {
      const std::int64_t g = h / (nh / groups);
      const double dt =
          std::log1p(std::exp(static_cast<double>(in.dt[t * nh + h]) + in.dt_bias[h]));
      const double da = std::exp(dt * in.a[h]);
      for (std::int64_t p = 0; p < pd; ++p) {
        const double x = in.x[(t * nh + h) * pd + p];
        double y = in.d[h] * x, mag = std::fabs(y);
        for (std::int64_t n = 0; n < ns; ++n) {
          double& sv = s[static_cast<std::size_t>((h * pd + p) * ns + n)];
          const double bx = dt * x * in.b[(t * groups + g) * ns + n];
          mag = std::max(mag, std::fabs(da * sv) + std::fabs(bx));
          sv = da * sv + bx;
          const double term = in.c[(t * groups + g) * ns + n] * sv;
          y += term;
          mag += std::fabs(term);
        }
        r.out.push_back(y);
        r.magnitude = std::max(r.magnitude, mag);
      }
    }
    if (every_state || t == num_tokens - 1) r.states.push_back(s);
  }
  return r;
}

double max_abs(std::span<const double> values) {
  double m = 0;
  for (double x : values) m = std::max(m, std::fabs(x));
  return m;
}

double output_tolerance(std::int64_t reduction, std::int64_t tokens, double magnitude) {
  const double eps = std::ldexp(1.0, -24);
  return 16 * eps * static_cast<double>(reduction + tokens) * magnitude;
}

double state_tolerance(DType dtype, std::int64_t reduction, std::int64_t tokens, double magnitude,
                       double max_state) {
  const RoundingBound rb = rounding_bound(dtype);
  return output_tolerance(reduction, tokens, magnitude) + rb.relative * max_state + rb.absolute;
}

}  // namespace mixkv::kernels
