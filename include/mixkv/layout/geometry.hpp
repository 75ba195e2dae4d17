// Byte geometry of a planned cache: where every layer's pages sit in the raw tensors, how a
// manager block splits into uniformly strided kernel pages (also when the manager page is
// padded), block tables in kernel units, slot mapping, and the transfer descriptors a
// prefill/decode connector uses — the same numbers the kernels read, so P/D agree byte for byte.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "mixkv/attn/attention_groups.hpp"
#include "mixkv/model/model.hpp"
#include "mixkv/plan/plan.hpp"

namespace mixkv::layout {

struct TensorGeometry {
  std::int64_t bytes = 0;
  std::int64_t num_pages = 0;    // manager blocks
  std::int64_t page_stride = 0;  // bytes from one manager block to the next
  bool operator==(const TensorGeometry&) const = default;
};

struct LayerGeometry {
  std::string layer;
  int kv_cache_group = 0;
  int attention_group = -1;  // -1 for recurrent layers
  bool recurrent = false;
  int tensor = 0;
  std::int64_t offset = 0;         // of the layer's first kernel page inside a manager page
  std::int64_t block_tokens = 0;   // manager block size (attention)
  std::int64_t kernel_tokens = 0;  // kernel page size (attention)
  std::int64_t kernel_pages_per_block = 1;
  std::int64_t kernel_page_stride = 0;  // bytes between consecutive kernel pages (uniform)
  std::int64_t kernel_page_bytes = 0;   // bytes of this layer inside one kernel page
  std::int64_t k_token_bytes = 0;       // K (or MLA latent) bytes of one token, all its KV heads
  std::int64_t v_token_bytes = 0;       // V bytes of one token (0 for MLA)
  std::int64_t v_offset = 0;            // V half inside the kernel page (K and V split)
  std::int64_t state_bytes = 0;         // recurrent layers: one state per manager block
  // The order of a K (V) half: NHD, token by token with a token's KV heads side by side; HND
  // (trtllm-gen's), KV head by KV head with a head's tokens side by side, so the rows one head
  // reads are contiguous. The same bytes either way; an MLA latent (one head) reads alike.
  attn::KvLayout kv_layout = attn::KvLayout::kNHD;
  int num_kv_heads = 1;  // the pieces a token's K and V split into by head (MLA: 1)

  // A KV head's piece of a token's K (V), the bytes from one head's piece to the next head's, and
  // from a head's piece of one token to the next token's, inside a kernel page.
  std::int64_t k_head_bytes() const {
    return num_kv_heads > 1 ? k_token_bytes / num_kv_heads : k_token_bytes;
  }
  std::int64_t v_head_bytes() const {
    return num_kv_heads > 1 ? v_token_bytes / num_kv_heads : v_token_bytes;
  }
  std::int64_t k_head_stride() const {
    return hnd() ? kernel_tokens * k_head_bytes() : k_head_bytes();
  }
  std::int64_t v_head_stride() const {
    return hnd() ? kernel_tokens * v_head_bytes() : v_head_bytes();
  }
  std::int64_t k_row_stride() const { return hnd() ? k_head_bytes() : k_token_bytes; }
  std::int64_t v_row_stride() const { return hnd() ? v_head_bytes() : v_token_bytes; }
  bool hnd() const { return kv_layout == attn::KvLayout::kHND && num_kv_heads > 1; }
  bool operator==(const LayerGeometry&) const = default;
};

struct Geometry {
  std::vector<TensorGeometry> tensors;
  std::vector<LayerGeometry> layers;  // in ModelDesc order
  const LayerGeometry& layer(std::string_view name) const;
};

// Throws Error when a page does not split evenly into kernel pages (R5), or a layer's pieces
// would cross a manager-page boundary.
Geometry make_geometry(const model::ModelDesc& desc, const plan::CachePlan& plan,
                       const std::vector<attn::AttentionGroup>& groups);

// Manager block ids -> kernel page ids: b -> b*k .. b*k + k - 1.
std::vector<std::int64_t> kernel_block_table(const LayerGeometry& layer,
                                             std::span<const std::int64_t> blocks);

struct TokenLocation {
  std::int64_t kernel_page = 0;
  std::int64_t slot = 0;      // kernel_page * kernel_tokens + position within the page
  std::int64_t k_offset = 0;  // byte offset of the token's K (or latent) in the tensor
  std::int64_t v_offset = 0;  // byte offset of the token's V in the tensor
  // HND: the offsets are of KV head 0's piece; head h's is h * k_head_stride() (v_head_stride())
  // further. NHD: the token's K (V) is k_token_bytes (v_token_bytes) from there.
};
// Where token `position` of a request with manager blocks `blocks` lives. Throws when the
// position is past the blocks.
TokenLocation locate_token(const LayerGeometry& layer, std::span<const std::int64_t> blocks,
                           std::int64_t position);

// One transfer descriptor: `count` pieces of `length` bytes, the i-th at base + i * stride.
struct TransferDescriptor {
  int tensor = 0;
  std::int64_t base = 0;
  std::int64_t length = 0;
  std::int64_t count = 0;
  std::int64_t stride = 0;
  bool operator==(const TransferDescriptor&) const = default;
};
// Exactly the bytes a request's kernels read for `layer`: the K and V of its first `num_tokens`
// tokens (whole kernel pages, then the filled part of the last one); recurrent layers: the state
// in each of `blocks`.
std::vector<TransferDescriptor> transfer_descriptors(const LayerGeometry& layer,
                                                     std::span<const std::int64_t> blocks,
                                                     std::int64_t num_tokens);

}  // namespace mixkv::layout
