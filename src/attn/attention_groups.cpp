#include "mixkv/attn/attention_groups.hpp"

#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "mixkv/core/error.hpp"

namespace mixkv::attn {

using backend::Backend;
using backend::KernelPageRule;
using backend::ModelTraits;

namespace {

const std::vector<DType> kAllDtypes = {DType::kBfloat16, DType::kFloat16, DType::kFloat32,
                                       DType::kFp8E4m3,  DType::kFp8E5m2, DType::kNvfp4};

BackendCaps make_caps(Backend backend) {
  BackendCaps c;
  c.backend = backend;
  switch (backend) {
    case Backend::kFlashinfer:
      c.uniform_window = c.uniform_soft_cap = c.uniform_scale = c.uniform_sinks = c.uniform_heads =
          true;
      // FlashInfer's paged wrappers take bf16/fp16 and fp8 e4m3/e5m2 caches, and nvfp4 with its
      // block scales (kv_cache_sf); not float32 (peers.md §5.1).
      c.cache_dtypes = {DType::kBfloat16, DType::kFloat16, DType::kFp8E4m3, DType::kFp8E5m2,
                        DType::kNvfp4};
      break;
    case Backend::kFlashinferTrtllm:
      // trtllm-gen takes the window and sinks per call (vLLM skips its uniformity check when every
      // path is trtllm), but its kernel is picked by head counts; HND layout by default.
      c.uniform_scale = c.uniform_heads = true;
      c.cache_dtypes = {DType::kBfloat16, DType::kFloat16, DType::kFp8E4m3, DType::kNvfp4};
      c.layout = KvLayout::kHND;
      break;
    case Backend::kFlashAttn:
    case Backend::kFlashAttn3:
      // Window, soft cap and FP8 descales are per call in FlashAttention (peers.md §5.2); the
      // vLLM builder's scheduler metadata is per group of equal heads. FP8 caches need FA3.
      c.uniform_heads = true;
      c.cache_dtypes = {DType::kBfloat16, DType::kFloat16};
      if (backend == Backend::kFlashAttn3) c.cache_dtypes.push_back(DType::kFp8E4m3);
      break;
    case Backend::kTriton:
    case Backend::kFlex:
      c.cache_dtypes = {DType::kBfloat16, DType::kFloat16, DType::kFloat32, DType::kFp8E4m3,
                        DType::kFp8E5m2};
      break;
    case Backend::kFlashMla:
    case Backend::kCutlassMla:
      c.uniform_scale = c.uniform_heads = true;
      c.supports_non_causal = false;
      c.cache_dtypes = {DType::kBfloat16, DType::kFloat16, DType::kFp8E4m3};
      break;
    case Backend::kCpu:
      // mixkv's own kernels read every per-layer parameter at run time.
      c.cache_dtypes = kAllDtypes;
      break;
  }
  return c;
}

std::string describe_heads(const AttentionParams& p) {
  return fmt::format("{}/{} heads", p.num_q_heads, p.num_kv_heads);
}

// The fields of `a` and `b` that differ and that `caps` fixes per plan.
std::vector<std::string> differences(const BackendCaps& caps, const AttentionParams& a,
                                     const AttentionParams& b) {
  std::vector<std::string> out;
  auto fmt_opt = [](const std::optional<double>& v) {
    return v ? fmt::format("{:g}", *v) : std::string("none");
  };
  if (caps.uniform_window && a.window_left != b.window_left) {
    out.push_back(fmt::format("window_left {} vs {}", b.window_left, a.window_left));
  }
  if (caps.uniform_soft_cap && a.soft_cap != b.soft_cap) {
    out.push_back(fmt::format("soft cap {} vs {}", fmt_opt(b.soft_cap), fmt_opt(a.soft_cap)));
  }
  if (caps.uniform_scale && a.scale != b.scale)
    out.push_back(fmt::format("scale {:.6g} vs {:.6g}", b.scale, a.scale));
  if (caps.uniform_sinks && a.sinks != b.sinks)
    out.push_back(b.sinks ? "sinks vs none" : "no sinks vs sinks");
  if (caps.uniform_causal && a.causal != b.causal)
    out.push_back(b.causal ? "causal vs non-causal" : "non-causal vs causal");
  if (a.kv_dtype != b.kv_dtype) {
    out.push_back(
        fmt::format("cache dtype {} vs {}", to_string(b.kv_dtype), to_string(a.kv_dtype)));
  }
  if (caps.uniform_heads && (a.num_q_heads != b.num_q_heads || a.num_kv_heads != b.num_kv_heads)) {
    out.push_back(fmt::format("{} vs {}", describe_heads(b), describe_heads(a)));
  }
  return out;
}

std::string kernel_path(Backend backend, const AttentionParams& p) {
  if (backend == Backend::kFlashinferTrtllm && p.num_kv_heads == 1) {
    return "flashinfer native (trtllm-gen rejects a single KV head)";
  }
  if (backend != Backend::kFlashinfer) return std::string(to_string(backend));
  const int gqa = p.num_q_heads / std::max(1, p.num_kv_heads);
  // CUDA-core decode kernels are compiled for these GQA group sizes only (peers.md §5.1).
  const bool cuda_core = gqa == 1 || gqa == 2 || gqa == 3 || gqa == 4 || gqa == 6 || gqa == 8;
  return fmt::format("flashinfer decode on {} (GQA {})", cuda_core ? "CUDA cores" : "tensor cores",
                     gqa);
}

std::string rule_text(const KernelPageRule& rule) {
  return rule.multiple_of > 0 ? fmt::format("multiples of {}", rule.multiple_of)
                              : fmt::format("{}", fmt::join(rule.sizes, ", "));
}

}  // namespace

std::string_view to_string(KvLayout layout) { return layout == KvLayout::kNHD ? "NHD" : "HND"; }

KvLayout parse_kv_layout(std::string_view text, const std::string& where) {
  if (text == "NHD") return KvLayout::kNHD;
  if (text == "HND") return KvLayout::kHND;
  throw_invalid(fmt::format("{} '{}' is not a KV layout; use NHD or HND", where, text));
}

const BackendCaps& capabilities(Backend backend) {
  static const std::map<Backend, BackendCaps> table = [] {
    std::map<Backend, BackendCaps> t;
    for (Backend b : backend::all_backends()) t.emplace(b, make_caps(b));
    return t;
  }();
  return table.at(backend);
}

AttentionParams attention_params(const model::LayerDesc& layer) {
  AttentionParams p;
  // A window of W tokens includes the query itself: W - 1 to its left.
  p.window_left = layer.window ? *layer.window - 1 : -1;
  p.soft_cap = layer.soft_cap;
  p.scale = layer.scale;
  p.sinks = layer.sinks;
  p.causal = layer.causal;
  p.kv_dtype = layer.kv_dtype;
  p.num_q_heads = layer.num_q_heads;
  p.num_kv_heads = layer.num_kv_heads;
  return p;
}

AttentionParams kernel_params(const AttentionGroup& group, const model::LayerDesc& layer) {
  const BackendCaps& caps = capabilities(group.backend);
  AttentionParams p = attention_params(layer);
  if (caps.uniform_window) p.window_left = group.params.window_left;
  if (caps.uniform_soft_cap) p.soft_cap = group.params.soft_cap;
  if (caps.uniform_scale) p.scale = group.params.scale;
  if (caps.uniform_sinks) p.sinks = group.params.sinks;
  if (caps.uniform_causal) p.causal = group.params.causal;
  p.kv_dtype = group.params.kv_dtype;
  return p;
}

std::vector<AttentionGroup> build_attention_groups(const model::ModelDesc& desc,
                                                   const plan::CachePlan& plan) {
  const BackendCaps& caps = capabilities(plan.backend);
  const ModelTraits traits = backend::model_traits(desc);
  std::map<std::string, const model::LayerDesc*> by_name;
  for (const auto& l : desc.layers) by_name[l.name] = &l;

  std::vector<AttentionGroup> out;
  for (const auto& kv_group : plan.groups) {
    if (kv_group.behaviour == plan::Behaviour::kRecurrent) continue;
    // vLLM has one cache dtype for every KV cache (--kv-cache-dtype), so its layers must share
    // it. A DSA indexer's key cache is not one: it keeps its own fp8 format under either policy.
    if (plan.policy == plan::Policy::kVllm) {
      const model::LayerDesc* first = nullptr;
      for (const auto& name : kv_group.layers) {
        const model::LayerDesc& l = *by_name.at(name);
        if (l.indexer) continue;
        if (first == nullptr) first = &l;
        if (l.kv_dtype != first->kv_dtype) {
          throw_invalid(fmt::format(
              "KV-cache group {} mixes cache dtypes: layer {} is {} but layer {} is {}; under "
              "--policy vllm a group holds one format (give them one dtype, or use --policy "
              "mixkv, which keeps them in separate attention groups)",
              kv_group.id, first->name, to_string(first->kv_dtype), l.name, to_string(l.kv_dtype)));
        }
      }
    }
    const std::size_t first_of_group = out.size();
    for (const auto& name : kv_group.layers) {
      const model::LayerDesc& layer = *by_name.at(name);
      const AttentionParams params = attention_params(layer);
      auto it = std::find_if(
          out.begin() + static_cast<std::ptrdiff_t>(first_of_group), out.end(),
          [&](const AttentionGroup& g) { return differences(caps, g.params, params).empty(); });
      if (it != out.end()) {
        it->layers.push_back(name);
        continue;
      }
      if (std::find(caps.cache_dtypes.begin(), caps.cache_dtypes.end(), params.kv_dtype) ==
          caps.cache_dtypes.end()) {
        throw_invalid(fmt::format(
            "layer {}: the {} backend has no kernel for a {} cache; choose another --kv-dtype "
            "or backend",
            name, to_string(plan.backend), to_string(params.kv_dtype)));
      }
      if (!params.causal && !caps.supports_non_causal) {
        throw_invalid(fmt::format(
            "layer {} is non-causal, which the {} backend does not serve; choose flashinfer, "
            "flash-attn, triton or cpu",
            name, to_string(plan.backend)));
      }
      // trtllm-gen's speculative decode with a bf16 query over an fp8 cache and a sliding window
      // silently mis-computes (FlashInfer issue #3864): refuse rather than serve wrong tokens.
      if (plan.backend == Backend::kFlashinferTrtllm && params.window_left >= 0 &&
          desc.num_spec_tokens > 0 &&
          (params.kv_dtype == DType::kFp8E4m3 || params.kv_dtype == DType::kFp8E5m2)) {
        throw_invalid(fmt::format(
            "layer {}: trtllm-gen mis-computes speculative decoding over an fp8 cache with a "
            "sliding window (FlashInfer issue #3864); use --backend flashinfer or a bf16 cache",
            name));
      }
      AttentionGroup g;
      g.id = static_cast<int>(out.size());
      g.kv_cache_group = kv_group.id;
      g.backend = plan.backend;
      g.layers = {name};
      g.params = params;
      g.layout = caps.layout;
      g.kv_split = caps.kv_split;
      g.kernel_path = kernel_path(plan.backend, params);
      // The kernel page comes from this group's own layer (its heads and kind), not the
      // KV-cache group's first layer: an MHA drafter beside a GQA target gets its own.
      const KernelPageRule rule = backend::kernel_page_rule(plan.backend, layer, traits);
      auto kernel = backend::select_kernel_page(rule, kv_group.block_size);
      if (!kernel || (kv_group.kernel_block_size != 0 && kv_group.block_size % *kernel != 0)) {
        throw_invalid(fmt::format(
            "attention group {} (layers {}..., {}) has no kernel page: {} accepts {} tokens "
            "per page, none divides the {}-token manager block of KV-cache group {}",
            g.id, name, describe_heads(params), rule.serving_kernel, rule_text(rule),
            kv_group.block_size, kv_group.id));
      }
      // The plan's layout is cut for the KV-cache group's kernel page; a group whose own rule
      // admits it keeps it (mixkv interleaves kernel pages, so all its groups share one).
      g.kernel_block_size =
          rule.accepts(kv_group.kernel_block_size) ? kv_group.kernel_block_size : *kernel;
      if (first_of_group == out.size()) {
        g.split_reason = fmt::format("first attention group of KV-cache group {}", kv_group.id);
      } else {
        g.split_reason =
            fmt::format("differs from attention group {}: {}", out[first_of_group].id,
                        fmt::join(differences(caps, out[first_of_group].params, params), "; "));
      }
      out.push_back(std::move(g));
    }
  }
  return out;
}

}  // namespace mixkv::attn
