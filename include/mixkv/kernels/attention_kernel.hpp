// Paged attention on the CPU over mixkv's own cache geometry: the slot-mapping write that stores
// new K/V, and decode/prefill attention that reads K/V only through a layer's LayerGeometry and a
// kernel-page block table. One AttentionSpec per attention group fixes everything the inner loop
// depends on (FlashInfer's plan()); a call takes only the data (its run()). docs/kernels.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mixkv/attn/attention_groups.hpp"
#include "mixkv/kernels/thread_pool.hpp"
#include "mixkv/layout/geometry.hpp"
#include "mixkv/model/model.hpp"

namespace mixkv::kernels {

// How a score and an output element are summed (docs/kernels.md, "The bf16-pair attention
// order"). Each is fixed by the shapes alone, never by rows, requests, threads or chunks.
enum class AttentionOrder {
  // Float products and sums (or AMX's on a CPU that has it, attention_uses_amx): the default.
  kFloat,
  // bf16 and fp8 e4m3 caches (each e4m3 code is a bf16 value exactly): q and the softmax
  // weights rounded to bf16, every product exact, summed in pairs as AVX512-BF16's VDPBF16PS sums
  // them (one instruction per 32 products where it exists; the same bits from ordinary
  // instructions where it does not). Needs head sizes that are multiples of 32 up to 512 and no
  // MLA.
  kBf16Pairs,
};
std::string_view to_string(AttentionOrder order);
// Parses "float" or "bf16-pairs"; throws Error naming `where` otherwise.
AttentionOrder parse_attention_order(std::string_view text, const std::string& where);

// What one attention layer's kernel computes: the attention group's parameters plus the layer's
// head sizes. MLA: one latent of head_size per token (num_kv_heads == 1), queries of head_size,
// values are the latent's first head_size_v elements.
struct AttentionSpec {
  attn::AttentionParams params;
  int head_size = 0;
  int head_size_v = 0;
  bool mla = false;
  AttentionOrder order = AttentionOrder::kFloat;
  bool operator==(const AttentionSpec&) const = default;
};

// The spec of `layer` under `params` (its attention group's, or attn::attention_params(layer) for
// backends that read every parameter per layer); head counts and sizes are always the layer's own.
// Throws Error for chunked-local layers and recurrent layers (not served by these kernels yet),
// an nvfp4 cache, heads that do not divide, or a layer `order` cannot serve (validate).
AttentionSpec attention_spec(const attn::AttentionParams& params, const model::LayerDesc& layer,
                             AttentionOrder order = AttentionOrder::kFloat);

// Checks the spec on its own (heads, head sizes, dtype); throws Error naming `where`.
void validate(const AttentionSpec& spec, const std::string& where);

// Per-tensor dequantisation scales of an fp8 cache (value = stored * scale); 1 for other dtypes.
struct KvScales {
  float k = 1.0f;
  float v = 1.0f;
  bool operator==(const KvScales&) const = default;
};

// Elements of one token's K row (all KV heads) and V row (0 for MLA).
std::int64_t k_row_elements(const AttentionSpec& spec);
std::int64_t v_row_elements(const AttentionSpec& spec);

// Slot-mapping write (vLLM's reshape_and_cache): token i of `k`/`v` goes to kernel slot
// slots[i] (kernel_page * kernel_tokens + position in the page, as layout::locate_token gives).
// k: [slots, num_kv_heads, head_size] (MLA: [slots, head_size]); v: [slots, num_kv_heads,
// head_size_v] (MLA: empty). Throws Error when the geometry does not match the spec, a slot is
// negative, or a write would leave `cache`.
void write_kv(const AttentionSpec& spec, const layout::LayerGeometry& layer, KvScales scales,
              std::span<std::byte> cache, std::span<const std::int64_t> slots,
              std::span<const float> k, std::span<const float> v);

// Kernel slots of positions [first, first + count) of a request with manager blocks `blocks`.
std::vector<std::int64_t> slot_mapping(const layout::LayerGeometry& layer,
                                       std::span<const std::int64_t> blocks, std::int64_t first,
                                       std::int64_t count);

// One request of a batch. Its query tokens are the last `num_queries` of its `kv_len` cached
// tokens (their K/V already written): decode has num_queries == 1, prefill/extend more.
struct PagedSequence {
  std::span<const std::int64_t> kernel_pages;  // kernel block table (layout::kernel_block_table)
  std::int64_t kv_len = 0;
  std::int64_t num_queries = 1;
};

struct AttentionInputs {
  std::span<const std::byte> cache;  // the layer's raw tensor
  std::span<const PagedSequence> batch;
  std::span<const float> queries;  // [sum of num_queries, num_q_heads, head_size], batch order
  std::span<const float> sinks;    // [num_q_heads] when spec.params.sinks, else empty
  KvScales scales;
  // Workers to spread requests and heads over; nullptr runs on the calling thread. Outputs are
  // bit-identical whatever the pool's size and whatever else is in the batch.
  ThreadPool* pool = nullptr;
};

// Attention of every query of `inputs.batch` over its paged context; out: [sum of num_queries,
// num_q_heads, head_size_v]. A query at position p sees keys k with
//   causal:     p - window_left <= k <= p
//   non-causal: p - window_left <= k <  kv_len   (the whole new block, both directions)
// (no lower bound when window_left < 0); logits are scale * q.k, then cap * tanh(x / cap) with a
// soft cap; a sink adds exp(sink) to the softmax denominator. Online softmax in float; pages
// wholly outside every query's window are never touched. Throws Error on a geometry that does not
// match the spec, shapes that do not match, or a page outside `cache`.
void paged_attention(const AttentionSpec& spec, const layout::LayerGeometry& layer,
                     const AttentionInputs& inputs, std::span<float> out);

// The instruction set paged_attention's inner loops use on this CPU (Highway's target name, e.g.
// "AVX3" for AVX-512, "AVX2"), chosen at run time.
std::string simd_target();

// Whether paged_attention over this layer runs its products on AMX tiles on this CPU: bf16
// caches (not MLA) with head sizes that are multiples of 32 and kernel pages of whole 16-key
// tiles, on a CPU and OS with AMX-BF16. Fixed by the layer and the CPU alone, so every call over
// the layer (decode, verify, prefill, any threads) takes the same path. Its order differs from the
// other paths' (docs/kernels.md), and it reads subnormal bf16 K/V values as zero and an infinite
// V as NaN (AMX flushes subnormals; the weight's split terms meet the infinity).
bool attention_uses_amx(const AttentionSpec& spec, const layout::LayerGeometry& layer);
// Switches the AMX path off (false) or on again for the whole process: tests use it to check the
// other paths on an AMX machine.
void set_attention_amx(bool on);
// Whether AttentionOrder::kBf16Pairs runs on VDPBF16PS on this CPU (AVX512-BF16, not switched
// off); the other paths give the same bits. set_attention_bf16_dots(false) switches it off for
// the whole process: tests use it to compare the two.
bool attention_uses_bf16_dots();
void set_attention_bf16_dots(bool on);

}  // namespace mixkv::kernels
