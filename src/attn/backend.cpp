#include "mixkv/backend.hpp"

#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "mixkv/error.hpp"

namespace mixkv::attn {
namespace {

struct BackendName {
  std::string_view name;
  Backend backend;
};
constexpr std::array kBackendNames = {
    BackendName{"flashinfer", Backend::kFlashinfer}, BackendName{"flash-attn", Backend::kFlashAttn},
    BackendName{"triton", Backend::kTriton},         BackendName{"flashmla", Backend::kFlashMla},
    BackendName{"cpu", Backend::kCpu},
};
constexpr std::array<std::string_view, 5> kNames = {"flashinfer", "flash-attn", "triton", "flashmla", "cpu"};

KernelPageRule listed(std::vector<std::int64_t> sizes, std::string_view kernel) {
  std::sort(sizes.rbegin(), sizes.rend());
  return KernelPageRule{std::move(sizes), 0, kernel};
}
KernelPageRule multiple(std::int64_t base, std::string_view kernel) { return KernelPageRule{{}, base, kernel}; }

}  // namespace

std::string_view to_string(Backend backend) {
  for (const auto& e : kBackendNames) {
    if (e.backend == backend) return e.name;
  }
  return "unknown";
}

std::optional<Backend> parse_backend(std::string_view text) {
  for (const auto& e : kBackendNames) {
    if (e.name == text) return e.backend;
  }
  if (text == "flash_attn" || text == "flash-attention") return Backend::kFlashAttn;
  return std::nullopt;
}

std::span<const std::string_view> backend_names() { return kNames; }

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
      traits.hybrid_with_fp32_state = traits.hybrid_with_fp32_state || tensor.dtype == DType::kFloat32;
    }
  }
  return traits;
}

KernelPageRule kernel_page_rule(Backend backend, const model::LayerDesc& layer, const ModelTraits& traits) {
  const bool mla = layer.kind == model::LayerKind::kMla;
  switch (backend) {
    case Backend::kFlashinfer:
      // FlashInfer's paged kernels: 16, 32 or 64 tokens per page; FlashInfer-MLA: 32 or 64.
      return mla ? listed({32, 64}, "flashinfer-mla") : listed({16, 32, 64}, "flashinfer");
    case Backend::kFlashAttn:
      if (mla) return multiple(16, "flash-attn-mla");
      return traits.hybrid_with_fp32_state ? listed({16, 32, 64}, "flash-attn (hybrid, fp32 state)")
                                           : multiple(16, "flash-attn");
    case Backend::kTriton:
      return multiple(16, mla ? "triton-mla" : "triton");
    case Backend::kFlashMla:
      if (!mla) {
        throw_invalid(fmt::format("layer {} is {} attention, which the flashmla backend does not serve "
                                  "(it runs MLA layers only); choose --backend flashinfer, flash-attn, "
                                  "triton or cpu",
                                  layer.name, to_string(layer.kind)));
      }
      return listed({64}, "flashmla");
    case Backend::kCpu:
      return multiple(16, "cpu");
  }
  throw_internal("kernel_page_rule: unknown backend");
}

std::optional<std::int64_t> select_kernel_page(const KernelPageRule& rule, std::int64_t manager_block) {
  if (rule.accepts(manager_block)) return manager_block;
  for (std::int64_t size : rule.sizes) {
    if (manager_block % size == 0) return size;
  }
  return std::nullopt;
}

}  // namespace mixkv::attn
