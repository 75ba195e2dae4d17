// Attention backends as data: which kernel page sizes each accepts for a layer. The planner asks
// this so it never picks a manager block size that some group cannot split into kernel pages.
// Sources: vLLM's get_supported_kernel_block_sizes() declarations (shared/design/vllm-reference.md
// §5.1); mixkv's own cpu backend accepts any multiple of 16 tokens.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "mixkv/model/model.hpp"

namespace mixkv::backend {

enum class Backend {
  kFlashinfer,        // FlashInfer's native paged kernels (FlashInfer-MLA for MLA layers)
  kFlashinferTrtllm,  // FlashInfer's trtllm-gen kernels (Blackwell)
  kFlashAttn,         // FlashAttention 2, vLLM's fork (pages in multiples of 16)
  kFlashAttn3,        // FlashAttention 3 (Hopper)
  kTriton,
  kFlex,        // PyTorch FlexAttention
  kFlashMla,    // FlashMLA (MLA only)
  kCutlassMla,  // CUTLASS MLA (MLA only)
  kCpu,         // mixkv's own CPU kernels
};
// Every backend, for tables and sweeps.
std::span<const Backend> all_backends();

std::string_view to_string(Backend backend);
std::optional<Backend> parse_backend(std::string_view text);
std::span<const std::string_view> backend_names();

// Kernel page sizes (tokens) a backend accepts: an explicit list, or any multiple of a base.
struct KernelPageRule {
  std::vector<std::int64_t> sizes;  // descending; empty when multiple_of is used
  std::int64_t multiple_of = 0;     // 0 when `sizes` is used
  std::string_view serving_kernel;  // which kernel the rule belongs to, for messages

  bool accepts(std::int64_t page) const;
  // Smallest page the rule accepts: the alignment grain of a manager block.
  std::int64_t grain() const;
  bool operator==(const KernelPageRule&) const = default;
};

struct ModelTraits {
  // FlashAttention narrows to 16/32/64 on hybrid models with float32 recurrent state
  // (FlashAttention issue #1974, as vLLM applies it).
  bool hybrid_with_fp32_state = false;
};
ModelTraits model_traits(const model::ModelDesc& desc);

// The rule for `layer` on `backend`; throws Error when the backend cannot serve the layer kind.
KernelPageRule kernel_page_rule(Backend backend, const model::LayerDesc& layer,
                                const ModelTraits& traits);

// The kernel page for a manager block of `manager_block` tokens: the block itself if accepted,
// else the largest listed size dividing it (vLLM's select_common_block_size). nullopt if none.
std::optional<std::int64_t> select_kernel_page(const KernelPageRule& rule,
                                               std::int64_t manager_block);

}  // namespace mixkv::backend
