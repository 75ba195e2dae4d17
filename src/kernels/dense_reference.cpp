#include "mixkv/kernels/dense_reference.hpp"

#include <cmath>

#include <fmt/format.h>

#include "mixkv/core/error.hpp"

namespace mixkv::kernels {

std::vector<double> dense_attention(const AttentionSpec& spec, const DenseSequence& seq,
                                    std::span<const float> sinks) {
  validate(spec, "dense_attention");
  const auto& params = spec.params;
  const std::int64_t hq = params.num_q_heads;
  const std::int64_t hkv = params.num_kv_heads;
  const std::int64_t d = spec.head_size;
  const std::int64_t dv = spec.head_size_v;
  const std::int64_t n = seq.kv_len;
  const std::int64_t nq = seq.num_queries;
  const auto sz = [](std::int64_t x) { return static_cast<std::size_t>(x); };
  if (nq < 1 || nq > n || seq.k.size() != sz(n * hkv * d) ||
      seq.v.size() != sz(spec.mla ? 0 : n * hkv * dv) || seq.q.size() != sz(nq * hq * d) ||
      sinks.size() != sz(params.sinks ? hq : 0)) {
    throw_invalid(fmt::format(
        "dense_attention: shapes do not match the spec ({} tokens, {} queries, {} K, {} V, {} Q "
        "values, {} sinks)",
        n, nq, seq.k.size(), seq.v.size(), seq.q.size(), sinks.size()));
  }
  std::vector<double> out(sz(nq * hq * dv), 0.0);
  std::vector<double> logits(sz(n));
  for (std::int64_t i = 0; i < nq; ++i) {
    const std::int64_t pos = n - nq + i;
    // Visible keys: [lo, hi].
    const std::int64_t hi = params.causal ? pos : n - 1;
    std::int64_t lo = 0;
    if (params.window_left >= 0 && pos - params.window_left > 0) lo = pos - params.window_left;
    for (std::int64_t h = 0; h < hq; ++h) {
      const std::int64_t kv_head = h / (hq / hkv);
      const float* q = seq.q.data() + (i * hq + h) * d;
      double max_logit = params.sinks ? static_cast<double>(sinks[sz(h)]) : -INFINITY;
      for (std::int64_t t = lo; t <= hi; ++t) {
        const float* k = seq.k.data() + (t * hkv + kv_head) * d;
        double x = sum_terms(d, [&](std::int64_t e) { return static_cast<double>(q[e]) * k[e]; });
        x *= params.scale;
        if (params.soft_cap) x = *params.soft_cap * std::tanh(x / *params.soft_cap);
        logits[sz(t)] = x;
        max_logit = std::max(max_logit, x);
      }
      double denom = params.sinks ? std::exp(sinks[sz(h)] - max_logit) : 0.0;
      double* o = out.data() + (i * hq + h) * dv;
      for (std::int64_t t = lo; t <= hi; ++t) {
        const double w = std::exp(logits[sz(t)] - max_logit);
        denom += w;
        const float* v = spec.mla ? seq.k.data() + t * d : seq.v.data() + (t * hkv + kv_head) * dv;
        for (std::int64_t e = 0; e < dv; ++e) o[e] += w * v[e];
      }
      for (std::int64_t e = 0; e < dv; ++e) o[e] /= denom;
    }
  }
  return out;
}

}  // namespace mixkv::kernels
