#include "mixkv/kernels/verify.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "mixkv/core/checked_math.hpp"
#include "mixkv/core/error.hpp"
#include "mixkv/kernels/convert.hpp"
#include "mixkv/kernels/dense_reference.hpp"
#include "mixkv/kernels/recurrent_kernel.hpp"
#include "mixkv/kernels/recurrent_reference.hpp"
#include "mixkv/plan/memory_budget.hpp"

namespace mixkv::kernels {

std::vector<float> stored_values(DType dtype, std::span<const float> values, float scale) {
  std::vector<std::byte> bytes(values.size() * static_cast<std::size_t>(element_bytes(dtype)));
  encode_row(dtype, values, scale, bytes);
  std::vector<float> back(values.size());
  decode_row(dtype, bytes, scale, back);
  return back;
}

void Comparison::merge(const Comparison& o) {
  max_error_stored = std::max(max_error_stored, o.max_error_stored);
  tolerance_stored = std::max(tolerance_stored, o.tolerance_stored);
  max_error_original = std::max(max_error_original, o.max_error_original);
  tolerance_original = std::max(tolerance_original, o.tolerance_original);
  max_reference = std::max(max_reference, o.max_reference);
}

std::string Comparison::to_string() const {
  return fmt::format(
      "max error {:.3g} (tolerance {:.3g}) over stored values, {:.3g} (tolerance {:.3g}) over the "
      "originals",
      max_error_stored, tolerance_stored, max_error_original, tolerance_original);
}

Comparison compare_with_reference(const AttentionSpec& spec, const AttentionSpec& reference_spec,
                                  const layout::LayerGeometry& layer, KvScales scales,
                                  std::span<const std::byte> cache,
                                  std::span<const CheckedSequence> sequences,
                                  std::span<const float> sinks) {
  const std::int64_t hq = spec.params.num_q_heads;
  const std::int64_t hkv = spec.params.num_kv_heads;
  const std::int64_t d = spec.head_size;
  const std::int64_t dv = spec.head_size_v;
  std::vector<PagedSequence> batch;
  std::vector<float> queries;
  for (const CheckedSequence& s : sequences) {
    batch.push_back({s.kernel_pages, s.kv_len, s.num_queries});
    queries.insert(queries.end(), s.q.begin(), s.q.end());
  }
  std::vector<float> out(queries.size() / static_cast<std::size_t>(d) *
                         static_cast<std::size_t>(dv));
  paged_attention(spec, layer, AttentionInputs{cache, batch, queries, sinks, scales}, out);

  const DType dtype = reference_spec.params.kv_dtype;
  const RoundingBound rb = rounding_bound(dtype);
  const double eps = std::ldexp(1.0, -24);
  Comparison c;
  std::size_t row = 0;
  for (const CheckedSequence& r : sequences) {
    const std::vector<float> ks = stored_values(dtype, r.k, scales.k);
    const std::vector<float> vs = stored_values(dtype, r.v, scales.v);
    const DenseSequence original{r.k, r.v, r.q, r.kv_len, r.num_queries};
    const DenseSequence cached{ks, vs, r.q, r.kv_len, r.num_queries};
    const std::vector<double> want = dense_attention(reference_spec, original, sinks);
    const std::vector<double> want_stored = dense_attention(reference_spec, cached, sinks);

    // Bounds from the data: max |v|, max over query heads and keys of sum |q||k|.
    const std::span<const float> values = reference_spec.mla ? r.k : r.v;
    double max_v = 0;
    for (float x : values) max_v = std::max(max_v, static_cast<double>(std::fabs(x)));
    double qk = 0, delta = 0;
    for (std::int64_t i = 0; i < r.num_queries; ++i) {
      for (std::int64_t h = 0; h < hq; ++h) {
        const float* q = r.q.data() + (i * hq + h) * d;
        const std::int64_t kh = h / (hq / hkv);
        for (std::int64_t t = 0; t < r.kv_len; ++t) {
          const float* k = r.k.data() + (t * hkv + kh) * d;
          const double s = sum_terms(d, [&](std::int64_t j) { return std::fabs(q[j] * k[j]); });
          const double e = sum_terms(d, [&](std::int64_t j) {
            return std::fabs(q[j]) * (rb.relative * std::fabs(k[j]) + rb.absolute * scales.k);
          });
          qk = std::max(qk, s);
          delta = std::max(delta, e);
        }
      }
    }
    const double scale = std::fabs(reference_spec.params.scale);
    const double arithmetic = 64 * eps * (1 + scale * qk) * max_v;
    const double weights = std::expm1(2 * scale * delta);
    const double max_v_stored = (1 + rb.relative) * max_v + rb.absolute * scales.v;
    const double rounding = weights * max_v_stored + rb.relative * max_v + rb.absolute * scales.v;
    // The bf16-pair order rounds q (each score moves by at most 2^-9 of sum |q||k|) and the
    // softmax weights (each output by at most 2^-9 of max |v|) to bf16.
    const double pairs =
        spec.order == AttentionOrder::kBf16Pairs
            ? std::expm1(2 * scale * 0x1p-9 * qk) * max_v_stored + 0x1p-9 * max_v_stored
            : 0.0;
    c.tolerance_stored = std::max(c.tolerance_stored, arithmetic + pairs);
    c.tolerance_original = std::max(c.tolerance_original, arithmetic + rounding + pairs);
    for (std::size_t j = 0; j < want.size(); ++j) {
      const double got = out[row + j];
      // NaN (a read of poisoned bytes) must count as a failure.
      const double e1 = std::isfinite(got) ? std::fabs(got - want_stored[j]) : INFINITY;
      const double e2 = std::isfinite(got) ? std::fabs(got - want[j]) : INFINITY;
      c.max_error_stored = std::max(c.max_error_stored, e1);
      c.max_error_original = std::max(c.max_error_original, e2);
      c.max_reference = std::max(c.max_reference, std::fabs(want_stored[j]));
    }
    row += want.size();
  }
  return c;
}

std::string_view to_string(GroupStatus status) {
  switch (status) {
    case GroupStatus::kPass:
      return "pass";
    case GroupStatus::kMismatch:
      return "MISMATCH";
    case GroupStatus::kSkipped:
      return "skipped";
    case GroupStatus::kNotVerified:
      return "not verified";
  }
  return "?";
}

bool VerifyReport::mismatch() const {
  return std::any_of(groups.begin(), groups.end(),
                     [](const GroupResult& g) { return g.status == GroupStatus::kMismatch; });
}

namespace {

// Default longest request of the scaled plan, before it is shrunk to fit the memory.
constexpr std::int64_t kDefaultMaxModelLen = 2048;
// Multiply-adds of dense reference work allowed per attention group; groups whose layers cost
// more are checked on their first and last layer and an even sample between.
constexpr double kReferenceBudget = 4e8;

// Memory scales verify picks by itself: from 1 MiB up, at most 4 GiB (the cache is allocated and
// poisoned for real, twice with recurrent groups, so the bound keeps verify's memory sane; the
// doubling search stops at the first scale that holds, so only models whose one request's states
// are large get there: Qwen3.5-27B at TP 1 with DFlash holds 2.7 GiB of GDN states and
// checkpoints). Where requests of the full length would need more, verify's requests are planned
// shorter instead.
constexpr std::int64_t kMiB = std::int64_t{1} << 20;
constexpr std::int64_t kMinAutoScale = kMiB;
constexpr std::int64_t kMaxAutoScale = std::int64_t{4} << 30;

std::string scale_text(std::int64_t bytes) {
  return bytes % kMiB == 0 ? fmt::format("{}MiB", bytes / kMiB) : fmt::format("{}B", bytes);
}

// Whether the plan's pools hold `requests` requests of `len` tokens beside the null block in
// their attention blocks (no block freed by a window), and then, in the pools afresh, one
// request's live state and checkpoints in every recurrent group: the recurrent check deals
// requests round-robin over its groups and checks those that got states, and a large hybrid's
// states for every request would take more memory than verify takes by itself.
bool holds_requests(const plan::CachePlan& plan, int requests, std::int64_t len, int spec_tokens) {
  std::map<int, std::int64_t> attention, recurrent;
  for (const plan::KvCacheGroup& g : plan.groups) {
    if (g.behaviour == plan::Behaviour::kRecurrent) {
      recurrent[g.pool] += 1 + spec_tokens;
    } else {
      attention[g.pool] += ceil_div(len, g.block_size);
    }
  }
  for (const plan::Pool& p : plan.pools) {
    const std::int64_t need = std::max(attention[p.id] * requests, recurrent[p.id]);
    if (need > p.num_blocks - 1) return false;
  }
  return true;
}

// The plan at `memory` bytes and `len` tokens, when it plans and holds verify's requests.
std::optional<plan::CachePlan> plan_holding(const model::ModelDesc& desc, plan::PlanOptions options,
                                            std::int64_t memory, std::int64_t len, int requests,
                                            std::int64_t longest_request) {
  options.memory_bytes = memory;
  options.max_model_len = len;
  try {
    plan::CachePlan plan = plan::make_plan(desc, options);
    if (!holds_requests(plan, requests, std::min(len, longest_request), desc.num_spec_tokens))
      return std::nullopt;
    return plan;
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kInvalidInput) throw;
    return std::nullopt;
  }
}

// The smallest scale (to 1 MiB) in [kMinAutoScale, kMaxAutoScale] whose plan holds verify's
// requests: doubling, then bisecting between the last scale that failed and the first that held.
std::optional<plan::CachePlan> smallest_scale(const model::ModelDesc& desc,
                                              const plan::PlanOptions& options, std::int64_t len,
                                              int requests, std::int64_t longest_request) {
  std::int64_t lo = 0;
  std::optional<plan::CachePlan> found;
  std::int64_t hi = kMinAutoScale;
  for (; hi <= kMaxAutoScale; lo = hi, hi *= 2) {
    found = plan_holding(desc, options, hi, len, requests, longest_request);
    if (found) break;
  }
  if (!found) return std::nullopt;
  while (hi - lo > kMiB) {
    const std::int64_t mid = (lo + hi) / 2 / kMiB * kMiB;
    if (auto p = plan_holding(desc, options, mid, len, requests, longest_request)) {
      hi = mid;
      found = std::move(p);
    } else {
      lo = mid;
    }
  }
  return found;
}

// The scale plain verify takes: the smallest (see smallest_scale) that holds `requests` requests
// of min(len, longest_request) tokens at max_model_len `len`; where none up to kMaxAutoScale
// does, requests half as long (verify then shortens its requests to fit, down to 16 tokens), and
// then, unless the user fixed it, half the max_model_len.
struct ScaledPlan {
  plan::CachePlan plan;
  std::int64_t longest_request = 0;  // tokens of verify's longest request in it
};

std::optional<ScaledPlan> auto_scale(const model::ModelDesc& desc, const plan::PlanOptions& options,
                                     std::int64_t len, bool fixed_len, int requests,
                                     std::int64_t longest_request) {
  for (;; len /= 2) {
    for (std::int64_t tokens = std::min(len, longest_request);; tokens /= 2) {
      if (auto plan = smallest_scale(desc, options, len, requests, tokens))
        return ScaledPlan{std::move(*plan), tokens};
      if (tokens <= 16) break;
    }
    if (fixed_len || len <= 16) return std::nullopt;
  }
}

// Why no scale works: the options themselves (the plan fails even with the most memory verify
// would take: that error, as is), or the memory (verify's requests need more than that bound).
[[noreturn]] void no_scale_works(const model::ModelDesc& desc, plan::PlanOptions options,
                                 std::int64_t len) {
  options.memory_bytes = kMaxAutoScale;
  options.max_model_len = len;
  (void)plan::make_plan(desc, options);  // throws when the options are at fault
  throw_invalid(fmt::format(
      "verify's requests need more than {} of scaled memory for this model (max_model_len {}); "
      "give a larger --memory-scale, or a smaller --max-model-len or --requests",
      scale_text(kMaxAutoScale), len));
}

// The scaled-down plan. Memory only sets how many blocks the pools get: block sizes, page
// bytes, padding, kernel pages, tensor sharing and layer offsets follow from the model's layers,
// the backend, the policy's alignment rules and max_model_len/request_len, so planning the same
// model and options in a small memory yields the same geometry over fewer blocks. max_model_len is
// the user's, else min(2048, the model's own). Without --memory-scale (memory_bytes 0) verify
// takes the smallest scale that holds its requests. With one, a max_model_len the user did not fix
// is halved until the plan fits (down to 16 tokens); when nothing fits, the error names the
// smallest scale that works, unless the options themselves are at fault.
ScaledPlan scaled_plan(const model::ModelDesc& desc, plan::PlanOptions options, int requests,
                       std::int64_t longest_request) {
  if (options.memory_bytes < 0) {
    throw_invalid(fmt::format("--memory-scale {} B is not positive", options.memory_bytes));
  }
  const bool fixed_len = options.max_model_len != 0;
  const std::int64_t default_len =
      fixed_len ? options.max_model_len
                : std::min(kDefaultMaxModelLen,
                           desc.facts.max_position_embeddings.value_or(kDefaultMaxModelLen));
  if (options.memory_bytes == 0) {
    if (auto plan = auto_scale(desc, options, default_len, fixed_len, requests, longest_request))
      return std::move(*plan);
    no_scale_works(desc, options, default_len);
  }
  std::int64_t len = default_len;
  for (;;) {
    options.max_model_len = len;
    try {
      return ScaledPlan{plan::make_plan(desc, options), longest_request};
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kInvalidInput) throw;
      if (!fixed_len && len > 16) {
        len /= 2;
        continue;
      }
      auto smallest = auto_scale(desc, options, default_len, fixed_len, requests, longest_request);
      if (!smallest) no_scale_works(desc, options, default_len);
      throw_invalid(fmt::format(
          "{} (verify plans with --memory-scale {}: too small; the smallest scale that works is "
          "--memory-scale {}, what verify takes without the option)",
          e.what(), scale_text(options.memory_bytes), scale_text(smallest->plan.memory_bytes)));
    }
  }
}

struct GroupBlocks {
  std::int64_t block_tokens = 0;
  std::int64_t window_left = -1;  // the widest of its layers; -1: none
  bool share = false;             // full attention: requests with a shared prefix share blocks
  std::vector<std::vector<std::int64_t>> tables;  // per request; 0 = the null block (freed)
};

// The first position any query of a request can see in a layer with `window_left`.
std::int64_t first_visible(std::int64_t window_left, std::int64_t kv_len, std::int64_t queries) {
  if (window_left < 0) return 0;
  return std::max<std::int64_t>(0, kv_len - queries - window_left);
}

std::string describe_params(const attn::AttentionParams& p, bool mla) {
  std::string s = fmt::format("{} q{}/kv{}", to_string(p.kv_dtype), p.num_q_heads, p.num_kv_heads);
  if (mla) s += " mla";
  if (p.window_left >= 0) s += fmt::format(" window {}", p.window_left);
  if (!p.causal) s += " non-causal";
  if (p.soft_cap) s += fmt::format(" cap {}", *p.soft_cap);
  if (p.sinks) s += " sinks";
  return s;
}

std::string describe_recurrent(const model::LayerDesc& layer, int num_spec_tokens) {
  if (layer.kind == model::LayerKind::kGdn) {
    const GdnLayerSpec s = gdn_layer_spec(layer, num_spec_tokens);
    return fmt::format("k{}/v{} {}x{} w{} {}/{}", s.gdn.num_k_heads, s.gdn.num_v_heads, s.gdn.k_dim,
                       s.gdn.v_dim, s.conv.kernel, to_string(s.conv.place.dtype),
                       to_string(s.gdn.place.dtype));
  }
  if (layer.kind == model::LayerKind::kKda) {
    const KdaLayerSpec s = kda_layer_spec(layer, num_spec_tokens);
    return fmt::format("k{}/v{} {}x{} w{} {}/{}", s.kda.num_k_heads, s.kda.num_v_heads, s.kda.k_dim,
                       s.kda.v_dim, s.q_conv.kernel, to_string(s.q_conv.place.dtype),
                       to_string(s.kda.place.dtype));
  }
  const Mamba2LayerSpec s = mamba2_layer_spec(layer, num_spec_tokens);
  return fmt::format("h{}x{} n{} g{} w{} {}/{}", s.ssm.heads, s.ssm.head_dim, s.ssm.state_size,
                     s.ssm.groups, s.conv.kernel, to_string(s.conv.place.dtype),
                     to_string(s.ssm.place.dtype));
}

// Multiply-adds of reference work allowed per recurrent group (layers are sampled like attention
// groups', one to three of them), and the tokens of the chunked-prefill check: one whole chunk
// of kPrefillChunk and a partial one.
constexpr double kRecurrentBudget = 3e8;
constexpr std::int64_t kPrefillChunk = 64;
constexpr std::int64_t kPrefillTokens = 72;

// Kernel against reference for one recurrent check: every comparison must hold on its own.
struct RecurrentCheck {
  double max_error = 0;
  double tolerance = 0;
  double max_reference = 0;
  bool ok = true;
  std::string first_failure;
  void add(std::span<const float> got, std::span<const double> want, double tol,
           std::string_view what) {
    double e = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      // NaN (a read of poisoned bytes) must count as a failure.
      e = std::max(e, std::isfinite(got[i]) ? std::fabs(got[i] - want[i]) : INFINITY);
      max_reference = std::max(max_reference, std::fabs(want[i]));
    }
    max_error = std::max(max_error, e);
    tolerance = std::max(tolerance, tol);
    if (!(e <= tol) && ok) {
      ok = false;
      first_failure = fmt::format("{}: max error {:.3g} > tolerance {:.3g}", what, e, tol);
    }
  }
};

// `count` of the indices 0 .. n-1, evenly spread, first and last included (just 0 for one).
std::set<std::size_t> even_sample(std::size_t n, std::size_t count) {
  std::set<std::size_t> picked;
  for (std::size_t k = 0; k < count; ++k) picked.insert(count == 1 ? 0 : k * (n - 1) / (count - 1));
  return picked;
}

}  // namespace

VerifyReport verify(const model::ModelDesc& desc, const VerifyOptions& options) {
  if (options.requests < 1 || options.requests > 64) {
    throw_invalid(fmt::format("--requests {} is out of range; use 1 to 64", options.requests));
  }
  if (options.longest_request < 1) {
    throw_invalid(fmt::format("longest request {} is not positive", options.longest_request));
  }
  VerifyReport report;
  ScaledPlan scaled = scaled_plan(desc, options.plan, options.requests, options.longest_request);
  report.plan = std::move(scaled.plan);
  const plan::CachePlan& plan = report.plan;
  std::int64_t cache_bytes = 0;
  for (const plan::Tensor& t : plan.tensors) cache_bytes += t.bytes;  // the plan bounds the sum
  plan::check_host_cache_bytes(cache_bytes, "verify's scaled plan", "--memory-scale");
  const std::vector<attn::AttentionGroup> groups = attn::build_attention_groups(desc, plan);
  const layout::Geometry geometry = layout::make_geometry(desc, plan, groups);
  if (options.fault_group >= 0 || options.fault_group < -1) {
    // A fault aimed at a group the plan does not have would silently test nothing.
    const bool state = options.fault == PlantedFault::kStateSlot;
    std::vector<int> ids;
    if (state) {
      for (const plan::KvCacheGroup& kv : plan.groups) {
        if (kv.behaviour == plan::Behaviour::kRecurrent) ids.push_back(kv.id);
      }
    } else {
      for (const attn::AttentionGroup& g : groups) ids.push_back(g.id);
    }
    if (options.fault == PlantedFault::kNone) {
      throw_invalid(fmt::format("--fault-group {} without --plant-fault plants nothing",
                                options.fault_group));
    }
    if (std::find(ids.begin(), ids.end(), options.fault_group) == ids.end()) {
      throw_invalid(
          fmt::format("--fault-group {} is not {} of this plan; it has {}", options.fault_group,
                      state ? "a recurrent KV-cache group" : "an attention group",
                      ids.empty() ? std::string("none") : fmt::format("{}", fmt::join(ids, ", "))));
    }
  }
  std::mt19937_64 rng(options.seed);
  auto layer_desc = [&](std::string_view name) -> const model::LayerDesc& {
    for (const auto& l : desc.layers) {
      if (l.name == name) return l;
    }
    throw_internal(fmt::format("layer {} of the plan is not in the model", name));
  };

  // Results in attention-group order; recurrent KV-cache groups after them.
  for (const attn::AttentionGroup& g : groups) {
    GroupResult r;
    r.attention_group = g.id;
    r.kv_cache_group = g.kv_cache_group;
    r.layers = g.layers;
    // A DSA indexer's key cache (fp8 keys and their scales) is checked as MLA latents of its
    // width: that pins its page geometry, not the indexer's top-k scoring, and the table says so.
    const bool indexer = layer_desc(g.layers.front()).indexer;
    r.kind = indexer ? "indexer" : std::string(model::to_string(layer_desc(g.layers.front()).kind));
    r.params = describe_params(g.params, false);
    for (const auto& name : g.layers) {
      try {
        const AttentionSpec s =
            attention_spec(attn::kernel_params(g, layer_desc(name)), layer_desc(name));
        r.params = describe_params(g.params, s.mla) + (indexer ? " (bytes as latents)" : "");
      } catch (const Error& e) {
        r.status = GroupStatus::kSkipped;
        r.reason = e.what();
        break;
      }
    }
    report.groups.push_back(std::move(r));
  }
  for (const plan::KvCacheGroup& kv : plan.groups) {
    if (kv.behaviour != plan::Behaviour::kRecurrent) continue;
    GroupResult r;
    r.kv_cache_group = kv.id;
    r.layers = kv.layers;
    r.kind = std::string(model::to_string(kv.kind));
    r.params = "recurrent state";
    if (kv.kind == model::LayerKind::kGdn || kv.kind == model::LayerKind::kKda ||
        kv.kind == model::LayerKind::kMamba2) {
      try {
        r.params = describe_recurrent(layer_desc(kv.layers.front()), desc.num_spec_tokens);
      } catch (const Error& e) {
        r.status = GroupStatus::kSkipped;
        r.reason = e.what();
      }
    } else {
      r.status = GroupStatus::kNotVerified;
      r.reason = fmt::format("no CPU kernel for {} layers yet (GDN, KDA and Mamba2 have one)",
                             model::to_string(kv.kind));
    }
    report.groups.push_back(std::move(r));
  }

  // The batch: request 0 as long as the plan allows (longer than any window), the others random;
  // every odd request shares a prefix with the one before it. Extends are short, except in a
  // non-causal group, whose queries are a whole draft block.
  if (options.max_layers_per_group < 0) {
    throw_invalid(fmt::format("max layers per group {} is negative; use 0 for the default",
                              options.max_layers_per_group));
  }
  const std::int64_t longest = std::min(plan.max_model_len, scaled.longest_request);
  const std::int64_t draft_block = std::max(1, desc.num_spec_tokens + 1);
  std::uniform_int_distribution<std::int64_t> len_dist(std::max<std::int64_t>(1, longest / 8),
                                                       longest);
  for (int i = 0; i < options.requests; ++i) {
    VerifyRequest q;
    q.kv_len = i == 0 ? longest : len_dist(rng);
    q.extend_queries = std::uniform_int_distribution<std::int64_t>(2, 8)(rng);
    if (i % 2 == 1) {
      q.shares_prefix_with = i - 1;
      const std::int64_t most =
          std::min(report.requests[static_cast<std::size_t>(i - 1)].kv_len, q.kv_len - 1);
      q.shared_tokens =
          most > 0 ? std::uniform_int_distribution<std::int64_t>(most / 2, most)(rng) : 0;
    }
    report.requests.push_back(q);
  }
  auto queries_for = [&](const attn::AttentionGroup& g, const VerifyRequest& q) {
    return std::min(q.kv_len, g.params.causal ? q.extend_queries : draft_block);
  };

  // Block tables per KV-cache group from each pool's free blocks (block 0 is the null block).
  // Blocks wholly before every query's window stay the null block, as after a sliding window
  // freed them; a request that would not fit the pools is shortened.
  std::map<int, std::vector<std::int64_t>> free;
  for (const plan::Pool& p : plan.pools) {
    auto& f = free[p.id];
    f.resize(static_cast<std::size_t>(std::max<std::int64_t>(0, p.num_blocks - 1)));
    std::iota(f.begin(), f.end(), 1);
    std::shuffle(f.begin(), f.end(), rng);
  }
  // Per KV-cache group: its block size and the widest window of its layers (their own
  // parameters: the truth, not what a faulty group is given).
  std::map<int, GroupBlocks> blocks;
  for (const attn::AttentionGroup& g : groups) {
    const plan::KvCacheGroup& kv = plan.groups.at(static_cast<std::size_t>(g.kv_cache_group));
    auto [it, fresh] = blocks.try_emplace(g.kv_cache_group);
    GroupBlocks& b = it->second;
    b.block_tokens = kv.block_size;
    b.share = kv.behaviour == plan::Behaviour::kAllTokens;
    if (fresh) b.window_left = -2;  // unset
    for (const auto& name : g.layers) {
      const auto w = attn::attention_params(layer_desc(name)).window_left;
      if (b.window_left == -2) {
        b.window_left = w;
      } else if (w < 0 || b.window_left < 0) {
        b.window_left = -1;
      } else {
        b.window_left = std::max(b.window_left, w);
      }
    }
  }
  const std::int64_t most_queries = std::max(draft_block, std::int64_t{8});
  for (std::size_t i = 0; i < report.requests.size(); ++i) {
    VerifyRequest& q = report.requests[i];
    if (q.shares_prefix_with >= 0) {
      q.shared_tokens = std::min(
          q.shared_tokens, report.requests[static_cast<std::size_t>(q.shares_prefix_with)].kv_len);
    }
    for (;;) {
      // Blocks each pool must give this request.
      std::map<int, std::int64_t> need;
      for (auto& [id, b] : blocks) {
        const std::int64_t n = (q.kv_len + b.block_tokens - 1) / b.block_tokens;
        std::int64_t kept = first_visible(b.window_left, q.kv_len, most_queries) / b.block_tokens;
        if (b.share && q.shares_prefix_with >= 0) kept = q.shared_tokens / b.block_tokens;
        need[plan.groups.at(static_cast<std::size_t>(id)).pool] += n - kept;
      }
      bool fits = true;
      for (auto [pool, n] : need) fits = fits && n <= static_cast<std::int64_t>(free[pool].size());
      if (fits) break;
      if (q.kv_len <= 1) {
        auto smallest = auto_scale(desc, options.plan, plan.max_model_len, true, options.requests,
                                   options.longest_request);
        throw_invalid(fmt::format(
            "the scaled plan (--memory-scale {}) has no free block for verify's requests; {}",
            scale_text(plan.memory_bytes),
            smallest ? fmt::format("the smallest scale that works is --memory-scale {}",
                                   scale_text(smallest->plan.memory_bytes))
                     : std::string("give a larger --memory-scale or fewer --requests")));
      }
      q.kv_len = std::max<std::int64_t>(1, q.kv_len / 2);
      q.extend_queries = std::min(q.extend_queries, q.kv_len);
      q.shared_tokens = std::min(q.shared_tokens, q.kv_len - 1);
    }
    for (auto& [id, b] : blocks) {
      auto& f = free[plan.groups.at(static_cast<std::size_t>(id)).pool];
      const std::int64_t n = (q.kv_len + b.block_tokens - 1) / b.block_tokens;
      const std::int64_t dropped =
          first_visible(b.window_left, q.kv_len, most_queries) / b.block_tokens;
      const std::int64_t shared =
          b.share && q.shares_prefix_with >= 0 ? q.shared_tokens / b.block_tokens : 0;
      std::vector<std::int64_t> t;
      for (std::int64_t k = 0; k < n; ++k) {
        if (k < shared) {
          t.push_back(b.tables[static_cast<std::size_t>(q.shares_prefix_with)]
                              [static_cast<std::size_t>(k)]);
        } else if (k < dropped) {
          t.push_back(0);
        } else {
          t.push_back(f.back());
          f.pop_back();
        }
      }
      b.tables.push_back(std::move(t));
    }
  }

  // The cache, allocated for real. 0xFF is NaN in every dtype: a read of bytes nobody wrote
  // poisons the output.
  std::vector<std::vector<std::byte>> tensors;
  for (const plan::Tensor& t : plan.tensors) {
    tensors.emplace_back(static_cast<std::size_t>(t.bytes), std::byte{0xFF});
    report.bytes_allocated += t.bytes;
  }

  // The layers checked per group: all of them, or an even sample (first and last included) when
  // the dense reference over all of them would take too long.
  struct LayerCase {
    std::size_t result = 0;  // index into report.groups
    std::size_t layer_index = 0;
    const model::LayerDesc* desc = nullptr;
    const attn::AttentionGroup* group = nullptr;
    layout::LayerGeometry geometry;
    AttentionSpec spec;       // from the attention group's parameters: what the kernel is given
    AttentionSpec reference;  // from the layer's own parameters: the truth
    KvScales scales;
  };
  std::vector<LayerCase> cases;
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    const attn::AttentionGroup& g = groups[gi];
    if (report.groups[gi].status != GroupStatus::kPass) continue;
    const AttentionSpec first = attention_spec(attn::kernel_params(g, layer_desc(g.layers.front())),
                                               layer_desc(g.layers.front()));
    double cost = 0;
    for (const VerifyRequest& q : report.requests) {
      cost += 3.0 * static_cast<double>(1 + queries_for(g, q)) * first.params.num_q_heads *
              static_cast<double>(q.kv_len) * (first.head_size + first.head_size_v);
    }
    const std::size_t n = g.layers.size();
    double most = static_cast<double>(n);
    if (options.max_layers_per_group > 0) {
      most = std::min(most, static_cast<double>(options.max_layers_per_group));
    }
    const auto sample = static_cast<std::size_t>(
        std::clamp(kReferenceBudget / std::max(cost, 1.0), std::min(2.0, most), most));
    const std::set<std::size_t> picked = even_sample(n, sample);
    for (std::size_t li : picked) {
      LayerCase c;
      c.result = gi;
      c.desc = &layer_desc(g.layers[li]);
      c.layer_index = static_cast<std::size_t>(c.desc - desc.layers.data());
      c.group = &g;
      c.geometry = geometry.layer(c.desc->name);
      c.spec = attention_spec(attn::kernel_params(g, *c.desc), *c.desc);
      c.reference = attention_spec(attn::attention_params(*c.desc), *c.desc);
      if (c.spec.params.kv_dtype == DType::kFp8E4m3 || c.spec.params.kv_dtype == DType::kFp8E5m2) {
        c.scales = KvScales{0.05f, 0.02f};
      }
      cases.push_back(std::move(c));
    }
    report.groups[gi].layers_checked = static_cast<int>(picked.size());
  }

  // A layer's logical K/V for one request, the same every time it is asked for (so they need
  // not be kept between the write and the check): random, except a shared prefix, which is the
  // other request's.
  struct Data {
    std::vector<float> k, v;
  };
  std::function<Data(const LayerCase&, std::size_t)> data = [&](const LayerCase& c, std::size_t i) {
    const VerifyRequest& q = report.requests[i];
    std::mt19937_64 r(options.seed * 0x9E3779B97F4A7C15ull + c.layer_index * 1000003ull + i);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    Data d;
    d.k.resize(static_cast<std::size_t>(q.kv_len * k_row_elements(c.reference)));
    d.v.resize(static_cast<std::size_t>(q.kv_len * v_row_elements(c.reference)));
    for (auto& x : d.k) x = dist(r);
    for (auto& x : d.v) x = dist(r);
    if (q.shares_prefix_with >= 0 && q.shared_tokens > 0) {
      const Data p = data(c, static_cast<std::size_t>(q.shares_prefix_with));
      std::copy_n(p.k.begin(), q.shared_tokens * k_row_elements(c.reference), d.k.begin());
      std::copy_n(p.v.begin(), q.shared_tokens * v_row_elements(c.reference), d.v.begin());
    }
    return d;
  };

  // Every checked layer's K/V is written before any kernel runs, so layers whose pages overlap
  // would clobber each other and show up. Each request is written from its first block that is
  // neither freed (window) nor shared (the other request wrote it), in two pieces as a prefill
  // and then an extend would.
  for (const LayerCase& c : cases) {
    const GroupBlocks& b = blocks.at(c.group->kv_cache_group);
    std::span<std::byte> tensor = tensors.at(static_cast<std::size_t>(c.geometry.tensor));
    const auto kr = static_cast<std::size_t>(k_row_elements(c.reference));
    const auto vr = static_cast<std::size_t>(v_row_elements(c.reference));
    for (std::size_t i = 0; i < report.requests.size(); ++i) {
      const VerifyRequest& q = report.requests[i];
      std::int64_t from = first_visible(b.window_left, q.kv_len, most_queries);
      if (b.share && q.shares_prefix_with >= 0) from = q.shared_tokens;
      from = from / b.block_tokens * b.block_tokens;
      const Data d = data(c, i);
      const std::int64_t split = std::uniform_int_distribution<std::int64_t>(from, q.kv_len)(rng);
      for (auto [first, count] :
           {std::pair{from, split - from}, std::pair{split, q.kv_len - split}}) {
        const auto slots = slot_mapping(c.geometry, b.tables[i], first, count);
        const auto f = static_cast<std::size_t>(first);
        const auto n = static_cast<std::size_t>(count);
        write_kv(c.reference, c.geometry, c.scales, tensor, slots,
                 std::span<const float>(d.k).subspan(f * kr, n * kr),
                 std::span<const float>(d.v).subspan(f * vr, n * vr));
      }
    }
  }

  // kTargetKernelPage: the geometry an engine would compute had it given every drafter group the
  // target's kernel page. Built lazily: make_geometry may refuse it (then the group mismatches
  // with that error).
  const auto target_page_geometry = [&]() -> layout::Geometry {
    std::int64_t target_page = 0;
    for (const attn::AttentionGroup& g : groups) {
      if (layer_desc(g.layers.front()).owner == model::Owner::kTarget) {
        target_page = g.kernel_block_size;
        break;
      }
    }
    if (target_page == 0) throw_invalid("the target has no attention group to take a page from");
    std::vector<attn::AttentionGroup> forced = groups;
    for (attn::AttentionGroup& g : forced) {
      const bool faulty = options.fault_group < 0 || options.fault_group == g.id;
      if (faulty && layer_desc(g.layers.front()).owner == model::Owner::kDraft) {
        g.kernel_block_size = target_page;
      }
    }
    return layout::make_geometry(desc, plan, forced);
  };

  // Recurrent layers checked per group, sampled like attention groups' (one to three).
  const auto per_request = static_cast<std::size_t>(1 + desc.num_spec_tokens);
  struct RecurrentCase {
    std::size_t result = 0;
    std::size_t layer_index = 0;
    const model::LayerDesc* desc = nullptr;
    int kv_cache_group = 0;
    layout::LayerGeometry geometry;
    model::LayerKind kind = model::LayerKind::kGdn;
    std::vector<ConvSpec> convs;  // GDN, Mamba2: one over all inputs; KDA: q, k, v
    GdnSpec temporal;             // GDN's temporal or KDA's recurrent state
    Mamba2Spec ssm;
    bool delta_rule() const { return kind != model::LayerKind::kMamba2; }
    const StateTensorPlace& place() const { return delta_rule() ? temporal.place : ssm.place; }
  };
  std::vector<RecurrentCase> recurrent_cases;
  for (std::size_t gi = groups.size(); gi < report.groups.size(); ++gi) {
    GroupResult& result = report.groups[gi];
    if (result.status != GroupStatus::kPass) continue;
    const plan::KvCacheGroup& kv = plan.groups.at(static_cast<std::size_t>(result.kv_cache_group));
    const std::size_t n = kv.layers.size();
    std::size_t sample = std::min<std::size_t>(n, 3);
    if (options.max_layers_per_group > 0) {
      sample = std::min(sample, static_cast<std::size_t>(options.max_layers_per_group));
    }
    {
      const model::LayerDesc& first = layer_desc(kv.layers.front());
      double per_token = 0;
      std::int64_t tokens = 1 + static_cast<std::int64_t>(std::max<std::size_t>(2, per_request));
      tokens *= std::ssize(report.requests);
      if (first.kind == model::LayerKind::kGdn) {
        const GdnLayerSpec s = gdn_layer_spec(first, desc.num_spec_tokens);
        per_token = 4.0 * static_cast<double>(s.gdn.place.elements) +
                    static_cast<double>(s.conv.channels * s.conv.kernel);
        if (options.chunked_prefill) tokens += kPrefillTokens;
      } else if (first.kind == model::LayerKind::kKda) {
        const KdaLayerSpec s = kda_layer_spec(first, desc.num_spec_tokens);
        per_token =
            4.0 * static_cast<double>(s.kda.place.elements) +
            static_cast<double>((s.q_conv.channels + s.k_conv.channels + s.v_conv.channels) *
                                s.q_conv.kernel);
        if (options.chunked_prefill) tokens += kPrefillTokens;
      } else {
        const Mamba2LayerSpec s = mamba2_layer_spec(first, desc.num_spec_tokens);
        per_token = 3.0 * static_cast<double>(s.ssm.place.elements) +
                    static_cast<double>(s.conv.channels * s.conv.kernel);
      }
      const double cost = per_token * static_cast<double>(tokens);
      sample = static_cast<std::size_t>(
          std::clamp(kRecurrentBudget / std::max(cost, 1.0), 1.0, static_cast<double>(sample)));
    }
    const std::set<std::size_t> picked = even_sample(n, sample);
    for (std::size_t li : picked) {
      RecurrentCase c;
      c.result = gi;
      c.desc = &layer_desc(kv.layers[li]);
      c.layer_index = static_cast<std::size_t>(c.desc - desc.layers.data());
      c.kv_cache_group = kv.id;
      c.geometry = geometry.layer(c.desc->name);
      c.kind = c.desc->kind;
      if (c.kind == model::LayerKind::kGdn) {
        const GdnLayerSpec s = gdn_layer_spec(*c.desc, desc.num_spec_tokens);
        c.convs = {s.conv};
        c.temporal = s.gdn;
      } else if (c.kind == model::LayerKind::kKda) {
        const KdaLayerSpec s = kda_layer_spec(*c.desc, desc.num_spec_tokens);
        c.convs = {s.q_conv, s.k_conv, s.v_conv};
        c.temporal = s.kda;
      } else {
        const Mamba2LayerSpec s = mamba2_layer_spec(*c.desc, desc.num_spec_tokens);
        c.convs = {s.conv};
        c.ssm = s.ssm;
      }
      recurrent_cases.push_back(std::move(c));
    }
    result.layers_checked = static_cast<int>(picked.size());
  }
  const int layers_to_check = static_cast<int>(cases.size() + recurrent_cases.size());

  // Run and compare: a decode batch (one query per request), then an extend batch.
  int done = 0;
  for (const LayerCase& c : cases) {
    GroupResult& result = report.groups[c.result];
    const GroupBlocks& b = blocks.at(c.group->kv_cache_group);
    layout::LayerGeometry given = c.geometry;
    AttentionSpec spec = c.spec;
    const bool faulty = options.fault_group < 0 || options.fault_group == c.group->id;
    if (faulty && options.fault == PlantedFault::kKernelPageStride) {
      const std::int64_t page = given.kernel_page_stride * given.kernel_pages_per_block;
      given.kernel_page_stride = page / (given.kernel_pages_per_block + 1);
    }
    if (faulty && options.fault == PlantedFault::kFullWindow) spec.params.window_left = -1;
    std::vector<float> sinks;
    std::mt19937_64 r(options.seed * 31 + c.layer_index);
    if (spec.params.sinks) {
      std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
      sinks.resize(static_cast<std::size_t>(spec.params.num_q_heads));
      for (auto& x : sinks) x = dist(r);
    }
    Comparison total;
    try {
      if (faulty && options.fault == PlantedFault::kTargetKernelPage) {
        given = target_page_geometry().layer(c.desc->name);
      }
      std::vector<Data> datas;
      std::vector<std::vector<std::int64_t>> pages;
      for (std::size_t i = 0; i < report.requests.size(); ++i) {
        datas.push_back(data(c, i));
        pages.push_back(layout::kernel_block_table(given, b.tables[i]));
      }
      for (bool extend : {false, true}) {
        std::vector<std::vector<float>> qs;
        std::vector<CheckedSequence> batch;
        for (std::size_t i = 0; i < report.requests.size(); ++i) {
          const VerifyRequest& q = report.requests[i];
          const std::int64_t nq = extend ? queries_for(*c.group, q) : 1;
          std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
          qs.emplace_back(static_cast<std::size_t>(nq * spec.params.num_q_heads * spec.head_size));
          for (auto& x : qs.back()) x = dist(r);
          batch.push_back({pages[i], q.kv_len, nq, datas[i].k, datas[i].v, qs.back()});
        }
        total.merge(compare_with_reference(spec, c.reference, given, c.scales,
                                           tensors.at(static_cast<std::size_t>(given.tensor)),
                                           batch, sinks));
      }
      if (!total.ok() && result.status == GroupStatus::kPass) {
        result.status = GroupStatus::kMismatch;
        result.reason = fmt::format("layer {}: {}", c.desc->name, total.to_string());
      }
    } catch (const Error& e) {
      total.max_error_stored = total.max_error_original = INFINITY;
      if (result.status == GroupStatus::kPass) {
        result.status = GroupStatus::kMismatch;
        result.reason = fmt::format("layer {}: {}", c.desc->name, e.what());
      }
    }
    result.max_abs_error = std::max(result.max_abs_error, total.max_error_stored);
    result.max_abs_error_original =
        std::max(result.max_abs_error_original, total.max_error_original);
    result.tolerance = std::max(result.tolerance, total.tolerance_stored);
    result.tolerance_original = std::max(result.tolerance_original, total.tolerance_original);
    if (total.max_reference > 0) {
      result.max_rel_error =
          std::max(result.max_rel_error, total.max_error_stored / total.max_reference);
    }
    if (options.progress) options.progress(++done, layers_to_check);
  }
  // The recurrent check gets the pools afresh (the attention check is done): each request holds
  // 1 + num_spec_tokens blocks of its group, as the manager gives them (table[0] the live state,
  // table[i] the checkpoint after draft i); requests are dealt round-robin over the groups, so a
  // small pool still gives every group one. The tensors are poisoned again.
  std::map<int, std::vector<std::vector<std::int64_t>>> state_tables;
  if (!recurrent_cases.empty()) {
    free.clear();
    for (const plan::Pool& p : plan.pools) {
      auto& f = free[p.id];
      f.resize(static_cast<std::size_t>(std::max<std::int64_t>(0, p.num_blocks - 1)));
      std::iota(f.begin(), f.end(), 1);
      std::shuffle(f.begin(), f.end(), rng);
    }
    for (auto& t : tensors) std::fill(t.begin(), t.end(), std::byte{0xFF});
  }
  for (std::size_t round = 0; round < report.requests.size(); ++round) {
    for (std::size_t gi = groups.size(); gi < report.groups.size(); ++gi) {
      if (report.groups[gi].status != GroupStatus::kPass) continue;
      const plan::KvCacheGroup& kv =
          plan.groups.at(static_cast<std::size_t>(report.groups[gi].kv_cache_group));
      std::vector<std::int64_t>& f = free[kv.pool];
      auto& tables = state_tables[kv.id];
      if (tables.size() == round && f.size() >= per_request) {
        tables.emplace_back(f.end() - static_cast<std::ptrdiff_t>(per_request), f.end());
        f.resize(f.size() - per_request);
      }
    }
  }
  for (std::size_t gi = groups.size(); gi < report.groups.size(); ++gi) {
    GroupResult& result = report.groups[gi];
    if (result.status == GroupStatus::kPass && state_tables[result.kv_cache_group].empty()) {
      result.status = GroupStatus::kSkipped;
      result.layers_checked = 0;
      result.reason = fmt::format(
          "the scaled plan has fewer than {} free blocks for one request's states; give a larger "
          "--memory-scale",
          per_request);
    }
  }
  std::erase_if(recurrent_cases,
                [&](const auto& c) { return state_tables[c.kv_cache_group].empty(); });
  // A request's start states for a layer, the same each time they are asked for: conv rows are
  // past inputs in [-1, 1], the temporal/ssm state in [-0.5, 0.5]. `conv` is an index into
  // c.convs, or -1 for the recurrence's state.
  auto start_state = [&](const RecurrentCase& c, std::size_t i, int conv) {
    std::mt19937_64 r(options.seed * 0x9E3779B97F4A7C15ull + c.layer_index * 1000003ull + 2 * i +
                      (conv >= 0 ? 1 + 7919ull * static_cast<unsigned>(conv) : 0) + 0x5EED);
    const StateTensorPlace& p =
        conv >= 0 ? c.convs[static_cast<std::size_t>(conv)].place : c.place();
    const float m = conv >= 0 ? 1.0f : 0.5f;
    std::uniform_real_distribution<float> dist(-m, m);
    std::vector<float> v(static_cast<std::size_t>(p.elements));
    for (auto& x : v) x = dist(r);
    return v;
  };
  // Every checked layer's states are written before any kernel runs, so states overlapping
  // another layer's bytes show up.
  for (const RecurrentCase& c : recurrent_cases) {
    std::span<std::byte> tensor = tensors.at(static_cast<std::size_t>(c.geometry.tensor));
    const auto& tables = state_tables.at(c.kv_cache_group);
    for (std::size_t i = 0; i < tables.size(); ++i) {
      for (std::size_t ci = 0; ci < c.convs.size(); ++ci) {
        write_state(c.convs[ci].place, c.geometry, tensor, tables[i][0],
                    start_state(c, i, static_cast<int>(ci)));
      }
      write_state(c.place(), c.geometry, tensor, tables[i][0], start_state(c, i, -1));
    }
  }
  // Recurrent layers, per request batch: a decode step in place (n = 1, out = in); a speculative
  // verify over 1 + num_spec_tokens tokens writing one checkpoint per position (two tokens,
  // final state only, without a drafter); for GDN and KDA a chunked prefill of kPrefillTokens
  // (options.chunked_prefill). Each starts from what the cache holds; the first from the values
  // written above, so a kernel reading the wrong bytes cannot agree with its reference.
  for (const RecurrentCase& c : recurrent_cases) {
    GroupResult& result = report.groups[c.result];
    const auto& tables = state_tables.at(c.kv_cache_group);
    layout::LayerGeometry given = c.geometry;
    const bool faulty = options.fault == PlantedFault::kStateSlot &&
                        (options.fault_group < 0 || options.fault_group == c.kv_cache_group);
    if (faulty) given.offset += given.kernel_page_stride;
    std::span<std::byte> tensor = tensors.at(static_cast<std::size_t>(c.geometry.tensor));
    std::mt19937_64 r(options.seed * 31 + c.layer_index + 0x7E57);
    auto random = [&](std::int64_t count, float lo, float hi) {
      std::uniform_real_distribution<float> dist(lo, hi);
      std::vector<float> v(static_cast<std::size_t>(count));
      for (auto& x : v) x = dist(r);
      return v;
    };
    // GDN's and KDA's q and k are L2-normalised by the model before the recurrence.
    auto unit_rows = [](std::vector<float> v, std::int64_t width) {
      for (std::size_t at = 0; at < v.size(); at += static_cast<std::size_t>(width)) {
        double norm = 0;
        for (std::int64_t i = 0; i < width; ++i) norm += double(v[at + i]) * v[at + i];
        const auto inv = static_cast<float>(1 / std::sqrt(norm + 1e-12));
        for (std::int64_t i = 0; i < width; ++i) v[at + i] *= inv;
      }
      return v;
    };
    auto rows = [](std::span<const float> v, std::size_t i, std::int64_t n, std::int64_t width) {
      return v.subspan(i * static_cast<std::size_t>(n * width),
                       static_cast<std::size_t>(n * width));
    };
    RecurrentCheck check;
    try {
      const std::int64_t spec = desc.num_spec_tokens;
      for (int step = 0; step < 3; ++step) {
        if (step == 2 && (!c.delta_rule() || !options.chunked_prefill)) break;
        const char* name = step == 0 ? "decode" : step == 1 ? "speculative verify" : "prefill";
        const std::int64_t n = step == 0   ? 1
                               : step == 1 ? std::max<std::int64_t>(2, 1 + spec)
                                           : kPrefillTokens;
        const bool checkpoints = step == 1 && spec > 0;
        // The long prefill runs on the first request only (the reference is the slow part).
        const std::size_t nreq = step == 2 ? 1 : tables.size();
        std::vector<std::vector<std::int64_t>> outs;
        std::vector<std::vector<std::vector<float>>> conv0(c.convs.size());  // [conv][request]
        std::vector<std::vector<float>> state0;
        std::vector<StateSequence> batch;
        for (std::size_t i = 0; i < nreq; ++i) {
          const std::vector<std::int64_t>& t = tables[i];
          outs.push_back(checkpoints ? t : std::vector<std::int64_t>{t[0]});
          for (std::size_t ci = 0; ci < c.convs.size(); ++ci) {
            const StateTensorPlace& p = c.convs[ci].place;
            conv0[ci].push_back(
                step == 0 ? stored_values(p.dtype, start_state(c, i, static_cast<int>(ci)), 1.0f)
                          : read_state(p, c.geometry, tensor, t[0]));
          }
          state0.push_back(step == 0 ? stored_values(c.place().dtype, start_state(c, i, -1), 1.0f)
                                     : read_state(c.place(), c.geometry, tensor, t[0]));
        }
        for (std::size_t i = 0; i < nreq; ++i) batch.push_back({tables[i][0], n, outs[i]});
        const auto requests = static_cast<std::int64_t>(nreq);
        // Stored states of request i against the reference run's.
        auto check_states = [&](const StateTensorPlace& place, std::size_t i,
                                const RecurrentRun& want, std::int64_t reduction,
                                std::string_view what) {
          for (std::size_t j = 0; j < outs[i].size(); ++j) {
            const std::vector<double>& ws =
                outs[i].size() == 1 ? want.states.back() : want.states[j];
            check.add(read_state(place, c.geometry, tensor, outs[i][j]), ws,
                      state_tolerance(place.dtype, reduction, n, want.magnitude, max_abs(ws)),
                      fmt::format("{} {} state {}", name, what, j));
          }
        };

        for (std::size_t ci = 0; ci < c.convs.size(); ++ci) {
          const ConvSpec& cs = c.convs[ci];
          const std::int64_t ch = cs.channels, kw = cs.kernel;
          const std::vector<float> x = random(requests * n * ch, -1, 1);
          const std::vector<float> w = random(ch * kw, -1, 1);
          const std::vector<float> bias = random(ch, -0.5f, 0.5f);
          std::vector<float> y(x.size());
          conv_update(cs, given, tensor, batch, ConvInputs{x, w, bias}, y);
          const std::string what = c.convs.size() == 1 ? "conv" : fmt::format("conv {}", ci);
          for (std::size_t i = 0; i < nreq; ++i) {
            const RecurrentRun want = reference_conv(
                cs, conv0[ci][i], n, ConvInputs{rows(x, i, n, ch), w, bias}, checkpoints);
            check.add(rows(y, i, n, ch), want.out, output_tolerance(kw, n, want.magnitude),
                      fmt::format("{} {} outputs", name, what));
            check_states(cs.place, i, want, kw, what);
          }
        }

        if (c.kind == model::LayerKind::kKda) {
          // Gates as Kimi Linear makes them (kda_gate): A = exp(A_log) in [1, 16], so a channel
          // decays by e^-0.007 to e^-34 per token.
          const KdaSpec& g = c.temporal;
          const std::int64_t qw = g.num_k_heads * g.k_dim, vw = g.num_v_heads * g.v_dim;
          const std::int64_t gw = g.num_v_heads * g.k_dim, hv = g.num_v_heads;
          const std::vector<float> q = unit_rows(random(requests * n * qw, -1, 1), g.k_dim);
          const std::vector<float> k = unit_rows(random(requests * n * qw, -1, 1), g.k_dim);
          const std::vector<float> v = random(requests * n * vw, -1, 1);
          const std::vector<float> raw = random(requests * n * gw, -4, 1);
          const std::vector<float> a_log = random(hv, 0, 2.77f);
          const std::vector<float> dt_bias = random(gw, -1, 1);
          std::vector<float> gate(raw.size());
          kda_gate(hv, g.k_dim, raw, a_log, dt_bias, gate);
          const std::vector<float> beta = random(requests * n * hv, 0, 1);
          std::vector<float> o(v.size());
          const KdaInputs in{q, k, v, gate, beta};
          if (step == 2) {
            kda_chunked_prefill(g, given, tensor, batch, in, kPrefillChunk, o);
          } else {
            kda_step(g, given, tensor, batch, in, o);
          }
          for (std::size_t i = 0; i < nreq; ++i) {
            const RecurrentRun want =
                reference_kda(g, state0[i], n,
                              KdaInputs{rows(q, i, n, qw), rows(k, i, n, qw), rows(v, i, n, vw),
                                        rows(gate, i, n, gw), rows(beta, i, n, hv)},
                              checkpoints);
            check.add(rows(o, i, n, vw), want.out, output_tolerance(g.k_dim, n, want.magnitude),
                      fmt::format("{} KDA outputs", name));
            check_states(g.place, i, want, g.k_dim, "recurrent");
          }
        } else if (c.kind == model::LayerKind::kGdn) {
          const GdnSpec& g = c.temporal;
          const std::int64_t qw = g.num_k_heads * g.k_dim, vw = g.num_v_heads * g.v_dim;
          const std::vector<float> q = unit_rows(random(requests * n * qw, -1, 1), g.k_dim);
          const std::vector<float> k = unit_rows(random(requests * n * qw, -1, 1), g.k_dim);
          const std::vector<float> v = random(requests * n * vw, -1, 1);
          const std::vector<float> gate = random(requests * n * g.num_v_heads, -1, 0);
          const std::vector<float> beta = random(requests * n * g.num_v_heads, 0, 1);
          std::vector<float> o(v.size());
          const GdnInputs in{q, k, v, gate, beta};
          if (step == 2) {
            gdn_chunked_prefill(g, given, tensor, batch, in, kPrefillChunk, o);
          } else {
            gdn_step(g, given, tensor, batch, in, o);
          }
          for (std::size_t i = 0; i < nreq; ++i) {
            const std::int64_t hv = g.num_v_heads;
            const RecurrentRun want =
                reference_gdn(g, state0[i], n,
                              GdnInputs{rows(q, i, n, qw), rows(k, i, n, qw), rows(v, i, n, vw),
                                        rows(gate, i, n, hv), rows(beta, i, n, hv)},
                              checkpoints);
            check.add(rows(o, i, n, vw), want.out, output_tolerance(g.k_dim, n, want.magnitude),
                      fmt::format("{} GDN outputs", name));
            check_states(g.place, i, want, g.k_dim, "temporal");
          }
        } else {
          const Mamba2Spec& m = c.ssm;
          const std::int64_t xw = m.heads * m.head_dim, bw = m.groups * m.state_size;
          const std::vector<float> xs = random(requests * n * xw, -1, 1);
          const std::vector<float> dt = random(requests * n * m.heads, -3, 1);
          const std::vector<float> b = random(requests * n * bw, -1, 1);
          const std::vector<float> cc = random(requests * n * bw, -1, 1);
          const std::vector<float> a = random(m.heads, -4, -0.5f);
          const std::vector<float> d = random(m.heads, -1, 1);
          const std::vector<float> dt_bias = random(m.heads, -1, 1);
          std::vector<float> out(xs.size());
          mamba2_step(m, given, tensor, batch, Mamba2Inputs{xs, dt, b, cc, a, d, dt_bias}, out);
          for (std::size_t i = 0; i < nreq; ++i) {
            const RecurrentRun want =
                reference_mamba2(m, state0[i], n,
                                 Mamba2Inputs{rows(xs, i, n, xw), rows(dt, i, n, m.heads),
                                              rows(b, i, n, bw), rows(cc, i, n, bw), a, d, dt_bias},
                                 checkpoints);
            check.add(rows(out, i, n, xw), want.out,
                      output_tolerance(m.state_size, n, want.magnitude),
                      fmt::format("{} Mamba2 outputs", name));
            check_states(m.place, i, want, m.state_size, "ssm");
          }
        }
      }
    } catch (const Error& e) {
      check.ok = false;
      check.max_error = INFINITY;
      check.first_failure = e.what();
    }
    if (!check.ok && result.status == GroupStatus::kPass) {
      result.status = GroupStatus::kMismatch;
      result.reason = fmt::format("layer {}: {}", c.desc->name, check.first_failure);
    }
    result.max_abs_error = std::max(result.max_abs_error, check.max_error);
    result.max_abs_error_original = result.max_abs_error;
    result.tolerance = std::max(result.tolerance, check.tolerance);
    result.tolerance_original = result.tolerance;
    if (check.max_reference > 0) {
      result.max_rel_error = std::max(result.max_rel_error, check.max_error / check.max_reference);
    }
    if (options.progress) options.progress(++done, layers_to_check);
  }
  return report;
}

}  // namespace mixkv::kernels
