// KV-cache planning: from a ModelDesc and a memory budget to a CachePlan (pools, KV-cache groups,
// block sizes, tensors, concurrency and every byte of waste). Pure: value types in, value out.
// Two policies: `vllm` reproduces vLLM's planner (with the drafter counted in hybrid alignment),
// `mixkv` searches for the layout that serves the most requests of the workload's length.
// docs/planning.md explains both.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mixkv/backend/backend.hpp"
#include "mixkv/model/model.hpp"

namespace mixkv::plan {

enum class Policy { kVllm, kMixkv };
std::string_view to_string(Policy policy);
std::optional<Policy> parse_policy(std::string_view text);

// How a layer's cache grows with its sequence.
enum class Behaviour {
  kAllTokens,  // full attention and MLA: every token
  kSliding,    // the last `window` tokens
  kChunked,    // the tokens of the current chunk
  kRecurrent,  // one state, plus one checkpoint per speculative token
};
std::string_view to_string(Behaviour behaviour);

// What one layer needs from the cache, in bytes.
struct LayerSpec {
  std::string layer;
  model::LayerKind kind = model::LayerKind::kFull;
  Behaviour behaviour = Behaviour::kAllTokens;
  std::int64_t bytes_per_token = 0;  // attention kinds
  std::int64_t state_bytes = 0;      // recurrent kinds: one state
  std::optional<std::int64_t> window;
  std::optional<std::int64_t> chunk;

  bool operator==(const LayerSpec&) const = default;
};
LayerSpec layer_spec(const model::LayerDesc& layer);

// Tokens of context an attention layer keeps for a request of `request_len` tokens while
// `spec_tokens` speculative tokens are being verified (sliding and chunked layers are bounded).
std::int64_t tokens_kept(const LayerSpec& spec, std::int64_t request_len, int spec_tokens);

struct PlanOptions {
  Policy policy = Policy::kMixkv;
  backend::Backend backend = backend::Backend::kFlashinfer;
  std::int64_t memory_bytes = 0;           // bytes for the KV cache, per TP rank
  std::optional<std::int64_t> block_size;  // user's attention block size (tokens)
  std::int64_t max_model_len = 0;          // 0: the model's max_position_embeddings
  std::int64_t request_len = 2500;
};

// One id space of equal pages.
struct Pool {
  int id = 0;
  std::int64_t page_bytes = 0;  // bytes of one block in each tensor of the pool
  std::int64_t num_blocks = 0;
  bool operator==(const Pool&) const = default;
};

// Where one layer's data sits inside a block of its group.
struct LayerPlacement {
  std::string layer;
  int tensor = 0;                 // index into CachePlan::tensors
  std::int64_t offset_bytes = 0;  // from the start of the block's page in that tensor
  std::int64_t bytes = 0;         // real bytes of this layer per block
  // Distance between consecutive kernel pages of this layer (attention), or between consecutive
  // blocks (recurrent). Uniform across the whole tensor.
  std::int64_t kernel_page_stride_bytes = 0;
  bool operator==(const LayerPlacement&) const = default;
};

struct KvCacheGroup {
  int id = 0;
  int pool = 0;
  Behaviour behaviour = Behaviour::kAllTokens;
  model::LayerKind kind = model::LayerKind::kFull;  // of its first layer
  std::vector<std::string> layers;
  std::int64_t block_size = 0;  // tokens per block; recurrent groups: max_model_len (one state)
  std::int64_t page_bytes = 0;  // bytes one block takes in each tensor it uses (padded)
  std::int64_t real_page_bytes = 0;  // bytes of data in it
  std::optional<std::int64_t> window;
  std::optional<std::int64_t> chunk;
  std::int64_t kernel_block_size = 0;   // tokens per kernel page (recurrent: block_size)
  std::int64_t blocks_per_request = 0;  // at the plan's request length
  std::vector<LayerPlacement> placement;
  bool operator==(const KvCacheGroup&) const = default;
};

struct Tensor {
  int pool = 0;
  std::int64_t bytes = 0;
  std::vector<std::string> shared_by;
  bool operator==(const Tensor&) const = default;
};

// Bytes by waste source. Per request unless noted: allocated bytes of one request equal its
// physical bytes plus these (an identity the tests check).
struct Waste {
  std::int64_t padding_layers = 0;       // tensor slots a group leaves empty (vLLM group_size)
  std::int64_t padded_pages = 0;         // pages padded beyond their data (live state, attention)
  std::int64_t block_tail = 0;           // tokens allocated past the request's last 16-token unit
  std::int64_t sliding_extra_block = 0;  // the block a window straddles
  std::int64_t checkpoints = 0;          // padding of speculative checkpoint states
  std::int64_t total() const {
    return padding_layers + padded_pages + block_tail + sliding_extra_block + checkpoints;
  }
  bool operator==(const Waste&) const = default;
};

struct Concurrency {
  std::int64_t request_len = 0;
  std::int64_t blocks_per_request = 0;
  std::int64_t max_requests = 0;  // whole requests that fit beside the null block
  double max_concurrency = 0;     // num_blocks / blocks_per_request, as vLLM reports it
  std::int64_t physical_bytes_per_request = 0;
  double physical_limit = 0;    // memory / physical bytes per request
  double efficiency = 0;        // max_concurrency / physical_limit
  double at_max_model_len = 0;  // max_concurrency for requests of max_model_len tokens
  bool operator==(const Concurrency&) const = default;
};

struct CachePlan {
  Policy policy = Policy::kMixkv;
  backend::Backend backend = backend::Backend::kFlashinfer;
  std::int64_t memory_bytes = 0;
  std::int64_t max_model_len = 0;
  std::int64_t request_len = 0;
  int num_spec_tokens = 0;
  std::int64_t block_unit_bytes = 0;  // bytes one block id costs across all tensors of its pool
  std::vector<Pool> pools;
  std::vector<KvCacheGroup> groups;
  std::vector<Tensor> tensors;
  Concurrency concurrency;
  Waste waste_per_request;
  std::int64_t pool_remainder_bytes = 0;     // memory no block can use
  std::int64_t max_model_len_that_fits = 0;  // longest single request the pool can hold
  std::vector<std::string> warnings;
  bool operator==(const CachePlan&) const = default;
};

// Plans the cache. Throws Error (kInvalidInput) when the model cannot be planned: memory too
// small for one request of max_model_len (the message gives the longest that fits), a block size
// the backend cannot use, pages that do not divide under the vllm policy, ...
CachePlan make_plan(const model::ModelDesc& desc, const PlanOptions& options);

// Bytes of one request of `request_len` tokens at 16-token granularity with nothing wasted.
std::int64_t physical_bytes_per_request(const model::ModelDesc& desc, std::int64_t request_len);

}  // namespace mixkv::plan
