#include "mixkv/backend/backend.hpp"

#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "mixkv/core/enum_names.hpp"
#include "mixkv/core/error.hpp"

namespace mixkv::backend {
namespace {

constexpr std::array kBackendNames = {
    Named<Backend>{"flashinfer", Backend::kFlashinfer},
    Named<Backend>{"flashinfer-trtllm", Backend::kFlashinferTrtllm},
    Named<Backend>{"flash-attn", Backend::kFlashAttn},
    Named<Backend>{"flash-attn3", Backend::kFlashAttn3},
    Named<Backend>{"triton", Backend::kTriton},
    Named<Backend>{"flex", Backend::kFlex},
    Named<Backend>{"flashmla", Backend::kFlashMla},
    Named<Backend>{"cutlass-mla", Backend::kCutlassMla},
    Named<Backend>{"cpu", Backend::kCpu},
};
constexpr std::array<std::string_view, kBackendNames.size()> kNames = [] {
  std::array<std::string_view, kBackendNames.size()> names{};
  for (std::size_t i = 0; i < kBackendNames.size(); ++i) names[i] = kBackendNames[i].name;
  return names;
}();
constexpr std::array<Backend, kBackendNames.size()> kAll = [] {
  std::array<Backend, kBackendNames.size()> all{};
  for (std::size_t i = 0; i < kBackendNames.size(); ++i) all[i] = kBackendNames[i].value;
  return all;
}();

KernelPageRule listed(std::vector<std::int64_t> sizes, std::string_view kernel) {
  std::sort(sizes.rbegin(), sizes.rend());
  return KernelPageRule{std::move(sizes), 0, kernel};
}
KernelPageRule multiple(std::int64_t base, std::string_view kernel) {
  return KernelPageRule{{}, base, kernel};
}

}  // namespace

std::string_view to_string(Backend backend) { return name_of(kBackendNames, backend); }

std::optional<Backend> parse_backend(std::string_view text) {
  if (auto backend = value_of(kBackendNames, text)) return backend;
  if (text == "flash_attn" || text == "flash-attention") return Backend::kFlashAttn;
  return std::nullopt;
}

std::span<const std::string_view> backend_names() { return kNames; }
std::span<const Backend> all_backends() { return kAll; }

bool KernelPageRule::accepts(std::int64_t page) const {
  if (page <= 0) return false;
  if (multiple_of > 0) return page % multiple_of == 0;
  return std::find(sizes.begin(), sizes.end(), page) != sizes.end();
}

std::int64_t KernelPageRule::grain() const { return multiple_of > 0 ? multiple_of : sizes.back(); }

ModelTraits model_traits(const model::ModelDesc& desc) {
  ModelTraits traits;
  for (const auto& layer : desc.layers) {
    for (const auto& tensor : layer.state) {
      traits.hybrid_with_fp32_state =
          traits.hybrid_with_fp32_state || tensor.dtype == DType::kFloat32;
    }
  }
  return traits;
}

KernelPageRule kernel_page_rule(Backend backend, const model::LayerDesc& layer,
                                const ModelTraits& traits) {
  const bool mla = layer.kind == model::LayerKind::kMla;
  auto mla_only = [&](std::string_view name) {
    if (!mla) {
      throw_invalid(fmt::format(
          "layer {} is {} attention, which the {} backend does not serve (it runs MLA layers "
          "only); choose --backend flashinfer, flash-attn, triton or cpu",
          layer.name, to_string(layer.kind), name));
    }
  };
  switch (backend) {
    case Backend::kFlashinfer:
      // FlashInfer's paged kernels: 16, 32 or 64 tokens per page; FlashInfer-MLA: 32 or 64
      // (vllm-reference.md §5.1).
      return mla ? listed({32, 64}, "flashinfer-mla") : listed({16, 32, 64}, "flashinfer");
    case Backend::kFlashinferTrtllm:
      if (mla) return listed({32, 64}, "trtllm-gen mla");
      // trtllm-gen needs a power-of-two numTokensPerPage: 16/32/64 from compiled cubins, 128
      // and up through its dynamic kernel (peers.md §5.1). Some versions reject a single KV
      // head (degenerate strides), which then runs on FlashInfer's native kernels.
      if (layer.num_kv_heads == 1)
        return listed({16, 32, 64}, "flashinfer (trtllm-gen rejects 1 KV head)");
      return listed({16, 32, 64, 128, 256, 512, 1024}, "trtllm-gen");
    case Backend::kFlashAttn:
      if (mla) return multiple(16, "flash-attn-mla");
      // vLLM's FlashAttention fork pages in multiples of 16, narrowed to 16/32/64 on hybrid models
      // with float32 recurrent state (FlashAttention issue #1974, as vLLM applies it).
      return traits.hybrid_with_fp32_state ? listed({16, 32, 64}, "flash-attn (hybrid, fp32 state)")
                                           : multiple(16, "flash-attn");
    case Backend::kFlashAttn3:
      // FA3 accepts any page size (non-TMA path below its tile); mixkv keeps 16-token pages so
      // plans stay on the 16-token grain of the physical limit (peers.md §5.2).
      return multiple(16, mla ? "flash-attn3-mla" : "flash-attn3");
    case Backend::kTriton:
      return multiple(16, mla ? "triton-mla" : "triton");
    case Backend::kFlex:
      // FlexAttention pages in multiples of 16 as vLLM declares it (vllm-reference.md §5.1, [M]).
      return multiple(16, "flex");
    case Backend::kFlashMla:
      mla_only("flashmla");
      return listed({64}, "flashmla");
    case Backend::kCutlassMla:
      mla_only("cutlass-mla");
      return listed({128}, "cutlass-mla");  // vllm-reference.md §5.1, marked [M] there
    case Backend::kCpu:
      return multiple(16, "cpu");
  }
  throw_internal("kernel_page_rule: unknown backend");
}

std::optional<std::int64_t> select_kernel_page(const KernelPageRule& rule,
                                               std::int64_t manager_block) {
  if (rule.accepts(manager_block)) return manager_block;
  for (std::int64_t size : rule.sizes) {
    if (manager_block % size == 0) return size;
  }
  return std::nullopt;
}

}  // namespace mixkv::backend
