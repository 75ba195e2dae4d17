// Sharding one layer for a tensor-parallel rank and sizing its recurrent state. Shard rules follow
// how serving engines split these layers (vLLM's QKV-parallel linear and
// MambaStateShapeCalculator): query heads split evenly; KV heads split evenly, or are replicated
// (one per rank) when there are fewer KV heads than ranks; linear-attention and Mamba heads and
// conv channels split evenly.
#include <fmt/format.h>

#include "layer_template.hpp"
#include "mixkv/core/checked_math.hpp"
#include "mixkv/core/error.hpp"

namespace mixkv::model {
namespace {

std::int64_t split(const LayerDesc& layer, std::string_view what, std::int64_t value, int tp) {
  if (value % tp != 0) {
    throw_invalid(
        fmt::format("layer {} ({}): {} = {} does not divide evenly over --tp {}; choose a "
                    "tensor-parallel size that divides {}",
                    layer.name, to_string(layer.kind), what, value, tp, value));
  }
  return value / tp;
}

std::int64_t shard_kv_heads(const LayerDesc& layer, std::int64_t kv_heads, int tp) {
  if (kv_heads >= tp) return split(layer, "num_kv_heads", kv_heads, tp);
  if (tp % kv_heads != 0) {
    throw_invalid(
        fmt::format("layer {}: {} KV heads cannot be replicated over --tp {}: the "
                    "tensor-parallel size must be a multiple of the KV head count",
                    layer.name, kv_heads, tp));
  }
  return 1;  // each rank holds one replicated KV head
}

// Conv states keep (conv_kernel - 1) past inputs plus one row per speculative token, so the
// verification pass can roll back to any accepted position.
std::int64_t conv_rows(std::int64_t conv_kernel, int num_spec_tokens) {
  return conv_kernel - 1 + num_spec_tokens;
}

int narrow(std::int64_t v) { return static_cast<int>(v); }  // callers bound v by kMaxConfigInt

}  // namespace

LayerDesc finalize_layer(const LayerTemplate& t, const FinalizeOptions& o) {
  LayerDesc d = t.desc;
  const int tp = o.tp;
  if (is_attention(d.kind)) {
    d.kv_dtype = o.kv_dtype;
    d.num_q_heads = narrow(split(d, "num_q_heads", d.num_q_heads, tp));
    if (d.kind != LayerKind::kMla) d.num_kv_heads = narrow(shard_kv_heads(d, d.num_kv_heads, tp));
    return d;
  }

  d.kv_dtype = o.conv_dtype;
  const std::int64_t rows_extra = o.num_spec_tokens;
  if (const auto* g = std::get_if<GdnParams>(&t.recurrent)) {
    const std::int64_t k_heads = split(d, "linear_num_key_heads", g->num_k_heads, tp);
    const std::int64_t v_heads = split(d, "linear_num_value_heads", g->num_v_heads, tp);
    // Conv runs over the concatenated q, k and v projections.
    const std::int64_t channels =
        checked_add(checked_product({2, k_heads, g->k_head_dim}, "GDN conv channels"),
                    checked_mul(v_heads, g->v_head_dim, "GDN conv channels"), "GDN conv channels");
    d.num_q_heads = narrow(k_heads);
    d.num_kv_heads = narrow(v_heads);
    d.head_size = narrow(g->k_head_dim);
    d.head_size_v = narrow(g->v_head_dim);
    d.state = {{"conv", {conv_rows(g->conv_kernel, rows_extra), channels}, o.conv_dtype},
               {"temporal", {v_heads, g->k_head_dim, g->v_head_dim}, o.ssm_dtype}};
  } else if (const auto* k = std::get_if<KdaParams>(&t.recurrent)) {
    const std::int64_t heads = split(d, "linear_attn_config.num_heads", k->num_heads, tp);
    const std::int64_t channels = checked_mul(heads, k->head_dim, "KDA conv channels");
    const std::int64_t rows = conv_rows(k->conv_kernel, rows_extra);
    d.num_q_heads = d.num_kv_heads = narrow(heads);
    d.head_size = d.head_size_v = narrow(k->head_dim);
    d.state = {{"q_conv", {rows, channels}, o.conv_dtype},
               {"k_conv", {rows, channels}, o.conv_dtype},
               {"v_conv", {rows, channels}, o.conv_dtype},
               {"recurrent", {heads, k->head_dim, k->head_dim}, o.ssm_dtype}};
  } else if (const auto* m = std::get_if<Mamba2Params>(&t.recurrent)) {
    const std::int64_t heads = split(d, "mamba_num_heads", m->num_heads, tp);
    // B and C groups split with the heads; a single group is replicated on every rank instead
    // (vLLM's MambaMixer2 accepts exactly these two cases).
    std::int64_t groups_per_rank = 1;
    if (m->n_groups % tp == 0) {
      groups_per_rank = m->n_groups / tp;
    } else if (m->n_groups != 1) {
      throw_invalid(
          fmt::format("layer {} (mamba2): n_groups = {} does not divide evenly over --tp {} "
                      "(only a single group can be replicated); choose a tensor-parallel "
                      "size that divides {}",
                      d.name, m->n_groups, tp, m->n_groups));
    }
    const std::int64_t inner = checked_mul(heads, m->head_dim, "Mamba2 inner size");
    const std::int64_t channels = checked_add(
        inner, checked_product({2, groups_per_rank, m->state_size}, "Mamba2 conv channels"),
        "Mamba2 conv channels");
    d.num_q_heads = d.num_kv_heads = narrow(heads);
    d.head_size = d.head_size_v = narrow(m->head_dim);
    d.state = {{"conv", {conv_rows(m->conv_kernel, rows_extra), channels}, o.conv_dtype},
               {"ssm", {heads, m->head_dim, m->state_size}, o.ssm_dtype}};
  } else if (const auto* m1 = std::get_if<Mamba1Params>(&t.recurrent)) {
    const std::int64_t inner =
        split(d, "mamba intermediate size (mamba_expand x hidden_size)", m1->intermediate, tp);
    d.num_q_heads = d.num_kv_heads = 0;
    d.head_size = d.head_size_v = 0;
    d.state = {{"conv", {conv_rows(m1->conv_kernel, rows_extra), inner}, o.conv_dtype},
               {"ssm", {inner, m1->state_size}, o.ssm_dtype}};
  } else {
    throw_internal(fmt::format("layer {}: recurrent kind without recurrent parameters", d.name));
  }
  return d;
}

}  // namespace mixkv::model
