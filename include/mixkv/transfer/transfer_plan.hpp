// What one request's transfer moves between a prefill rank and a decode rank: copy runs from the
// prefill side's pages to the decode side's, each side in its own geometry (block sizes, kernel
// pages, strides, KV-head slice), and the checksum units the decode side verifies. Pure: both
// sides compute the same plan from the two descriptors and the two block tables.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "mixkv/transfer/layout_descriptor.hpp"

namespace mixkv::transfer {

// Manager block ids of one request on one side, per KV-cache group of that side. Attention
// groups: one block per block_size tokens (block 0 is the null block: never moved); recurrent
// groups: the live state block first (the cache manager's block_table order).
struct RequestBlocks {
  std::vector<std::vector<std::int64_t>> groups;
  bool operator==(const RequestBlocks&) const = default;
};

// `length` bytes from offset `src_offset` of prefill tensor `src_tensor` to `dst_offset` of
// decode tensor `dst_tensor`.
struct CopyRun {
  int src_tensor = 0;
  std::int64_t src_offset = 0;
  int dst_tensor = 0;
  std::int64_t dst_offset = 0;
  std::int64_t length = 0;
  bool operator==(const CopyRun&) const = default;
};

// One checksummed page: the runs [run_begin, run_end) carry, in this order, the K then the V
// bytes (this pair's KV-head slice) of the tokens [first_token, end_token) that one prefill
// kernel page holds of one layer, or one recurrent state.
struct ChecksumUnit {
  int layer = 0;  // index into the descriptors' layers
  std::int64_t first_token = 0;
  std::int64_t end_token = 0;
  std::size_t run_begin = 0;
  std::size_t run_end = 0;
  // The unit moves every byte the prefill rank holds of these tokens (all its KV heads, or the
  // whole state): its checksum does not depend on the decode side, so the prefill side can
  // compute it before any decode side asks (PrefillAgent::offer).
  bool whole = false;
};

struct PullPlan {
  std::vector<CopyRun> runs;
  std::vector<ChecksumUnit> units;
  std::int64_t bytes = 0;
};

struct PullSpec {
  std::int64_t num_tokens = 0;   // prompt tokens whose KV moves (the prefill boundary)
  std::int64_t first_token = 0;  // tokens before it the decode side already holds (prefix hit)
};

// The runs that bring a request's KV from `prefill` (one TP rank) to `decode` (one TP rank):
// per attention layer the tokens [first, num_tokens) its next query can read (a sliding window
// or the current chunk only) and the KV heads the decode rank holds that this prefill rank is
// the first owner of; per recurrent layer its state (same TP rank only). Empty when the pair
// shares nothing. Throws Error naming the layer/group for blocks that do not cover the tokens,
// a needed null block, or a run outside a tensor. Call reconcile() first.
PullPlan plan_pull(const LayoutDescriptor& prefill, const LayoutDescriptor& decode,
                   const RequestBlocks& prefill_blocks, const RequestBlocks& decode_blocks,
                   const PullSpec& spec);

// Bytes of the tensors of one side, indexed like the descriptor's tensor_bytes.
using TensorSpans = std::vector<std::span<std::byte>>;

// XXH3-64 of one unit / every unit, read from the prefill side (`source` true) or the decode side.
std::uint64_t unit_checksum(const PullPlan& plan, std::size_t unit, const TensorSpans& tensors,
                            bool source);
std::vector<std::uint64_t> unit_checksums(const PullPlan& plan, const TensorSpans& tensors,
                                          bool source);

// Copies every run within one address space (tests and the layout-level checks).
void apply_locally(const PullPlan& plan, const TensorSpans& prefill, const TensorSpans& decode);

}  // namespace mixkv::transfer
