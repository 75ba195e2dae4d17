// The layout descriptor two instances exchange before moving KV: what each side's cache looks
// like byte for byte (the layout module's geometry, per layer and KV-cache group), which model it
// holds and which TP rank it is. reconcile() decides whether a prefill side and a decode side can
// move pages between them; docs/transfer.md documents the JSON form.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mixkv/attn/attention_groups.hpp"
#include "mixkv/layout/geometry.hpp"
#include "mixkv/model/model.hpp"
#include "mixkv/plan/plan.hpp"

namespace mixkv::transfer {

// Bumped on every change of the JSON form; a peer of another version is refused.
inline constexpr int kDescriptorVersion = 3;

// A run of a state tensor's split dimension that TP shards as one piece: each rank holds its
// `size` elements of it (rank r the r-th share of the whole), or, `replicated`, every rank the
// same whole piece (a Mamba2 layer's single B/C group).
struct StateSegment {
  std::int64_t size = 0;  // per TP rank
  bool replicated = false;
  bool operator==(const StateSegment&) const = default;
};

struct StateTensorLayout {
  std::string name;
  std::vector<std::int64_t> shape;  // per TP rank
  std::string dtype;
  // How TP shards it, as the model's sharding does (model/tensor_parallel.cpp): dimension
  // `split_dim` is the concatenation of `segments` (a GDN conv's channels: q, k, v heads; a
  // Mamba2 conv's: x, B, C), each split over the ranks on its own. -1: no known split (a state
  // tensor of a native model file); such a layer moves only between equal TP sizes.
  int split_dim = -1;
  std::vector<StateSegment> segments;
  bool operator==(const StateTensorLayout&) const = default;
};

// One layer: its model facts (what must agree) and its geometry (what may differ).
struct LayerLayout {
  std::string name;
  std::string owner;  // "target" or "draft"
  std::string kind;   // model::LayerKind name
  bool recurrent = false;
  int kv_cache_group = 0;
  int head_size = 0;
  int head_size_v = 0;
  std::string dtype;  // cache dtype (recurrent: conv state dtype)
  // KV heads of the whole model and the ones this rank holds: [kv_head_begin, + num_kv_heads).
  // MLA latents (and indexer keys) are replicated: every rank holds head 0 of 1.
  int total_kv_heads = 0;
  int kv_head_begin = 0;
  int num_kv_heads = 0;
  std::optional<std::int64_t> window;
  std::optional<std::int64_t> chunk;
  // Geometry (layout::LayerGeometry).
  int tensor = 0;
  std::int64_t offset = 0;
  std::int64_t block_tokens = 0;
  std::int64_t kernel_tokens = 0;
  std::int64_t kernel_pages_per_block = 1;
  std::int64_t kernel_page_stride = 0;
  std::int64_t k_token_bytes = 0;
  std::int64_t v_token_bytes = 0;
  std::int64_t v_offset = 0;
  attn::KvLayout kv_layout = attn::KvLayout::kNHD;  // the sides may differ: runs follow each
  std::int64_t state_bytes = 0;
  std::vector<StateTensorLayout> state;
  bool operator==(const LayerLayout&) const = default;
};

struct GroupLayout {
  int id = 0;
  std::string behaviour;  // plan::Behaviour name
  std::string kind;
  std::int64_t block_size = 0;
  bool draft = false;  // every layer of the group is the drafter's
  std::vector<std::string> layers;
  bool operator==(const GroupLayout&) const = default;
};

struct LayoutDescriptor {
  int version = kDescriptorVersion;
  std::string model_id;  // 16 hex digits: XXH3-64 of the model's identity (see model_identity)
  std::string model;
  std::optional<std::string> draft;
  int tp_size = 1;
  int tp_rank = 0;
  std::string policy;
  std::vector<std::int64_t> tensor_bytes;
  std::vector<GroupLayout> groups;
  std::vector<LayerLayout> layers;  // in ModelDesc order
  const LayerLayout* find_layer(const std::string& name) const;
  bool operator==(const LayoutDescriptor&) const = default;
};

// Bounds descriptor_from_json() puts on a peer's numbers: a tensor's bytes (and every byte
// offset, stride and count inside it), and a block's or kernel page's tokens.
inline constexpr std::int64_t kMaxTensorBytes = std::int64_t{1} << 50;
inline constexpr std::int64_t kMaxBlockTokens = std::int64_t{1} << 31;

struct DescriptorOptions {
  int tp_rank = 0;
  // The same model described at TP 1, for the whole model's KV-head counts. Without it a layer
  // has num_kv_heads x tp heads, which is wrong only where TP replicates KV heads (TP > heads).
  const model::ModelDesc* unsharded = nullptr;
};

// XXH3-64, as 16 hex digits, of what makes two instances hold the same model: target and
// drafter names and every layer's name, owner and kind. Shapes and dtypes are checked one by one
// by reconcile(), so their mismatches are reported by field.
std::string model_identity(const model::ModelDesc& desc);

LayoutDescriptor make_descriptor(const model::ModelDesc& desc, const plan::CachePlan& plan,
                                 const layout::Geometry& geometry,
                                 const DescriptorOptions& options = {});

// Elements and bytes of one state tensor (its per-rank shape); bytes of a layer's state tensors,
// laid one after another in its state page (as the recurrent kernels place them); a tensor's
// shape in the whole model, from its per-rank shape on a side of `tp` ranks.
std::int64_t element_count(const StateTensorLayout& tensor);
std::int64_t state_tensor_bytes(const StateTensorLayout& tensor);
std::int64_t sum_state_bytes(const LayerLayout& layer);
std::vector<std::int64_t> whole_shape(const StateTensorLayout& tensor, int tp);

nlohmann::json to_json(const LayoutDescriptor& descriptor);
// Throws Error (kInvalidInput) naming the key at fault for a malformed or foreign descriptor.
LayoutDescriptor descriptor_from_json(const nlohmann::json& json);

// What reconcile() accepted that differs between the two sides, one line each.
struct Reconciliation {
  std::vector<std::string> differences;
};

// Checks that KV can move from `prefill` to `decode`. Accepts different block sizes, kernel
// pages, strides, policies and TP sizes (KV heads and recurrent heads are sliced); refuses, with
// an Error that names the field and both sides' values, a different version, model, layer set,
// dtype, head size, window, recurrent state shape (of the whole model, across TP sizes) or a TP
// change of a state tensor without a known split.
Reconciliation reconcile(const LayoutDescriptor& prefill, const LayoutDescriptor& decode);

}  // namespace mixkv::transfer
