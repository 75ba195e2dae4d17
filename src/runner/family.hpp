// How an architecture family turns a ModelDesc, its Architecture and its weights into the
// runner's blocks. Each family is one small file (llama.cpp, qwen3_next.cpp, gemma2.cpp,
// nemotron_h.cpp; the drafter heads in heads.cpp) composed from the shared blocks; the same code
// lists the weights' names and shapes (weight_shapes) when it runs without weights.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mixkv/attn/attention_groups.hpp"
#include "mixkv/layout/geometry.hpp"
#include "mixkv/model/architecture.hpp"
#include "mixkv/model/model.hpp"
#include "runner/blocks.hpp"
#include "runner/names.hpp"

namespace mixkv::runner {

// The loaded network, target and drafter.
struct Network {
  std::vector<Block> blocks;
  Matrix embed, lm_head;  // rows are tokens; a tied head is the embedding
  std::vector<float> final_norm;
  // The GGUF the matrices view, kept mapped as long as they are used; null for float weights.
  std::shared_ptr<const weights::GgufFile> file;
  float embed_scale = 1.0f;                   // Gemma 2: sqrt(hidden)
  std::optional<double> final_logit_softcap;  // Gemma 2
  double eps = 1e-5;
  // The drafter's layers and head (EAGLE, MTP or DFlash); empty without one.
  std::vector<Block> draft_blocks;
  Matrix draft_fc;
  std::vector<float> draft_norm;
  std::vector<float> mtp_norm_embedding, mtp_norm_hidden;  // MTP only: before draft_fc
  std::vector<float> dflash_hidden_norm;                   // DFlash only
  // DFlash only: the drafter layers' attention, for context K/V without a query.
  std::vector<const Attention*> dflash_attention;
  double draft_eps = 1e-5;
  // The forwards' layer buffers (one forward at a time runs on a runner); one per part of a
  // forward run as a part per thread (ModelRunner::forward_parts).
  Scratch scratch;
  std::vector<Scratch> part_scratch;
};

// What a family builds from: the description, the architecture, the weights; and, when the
// cache is planned, each layer's geometry and kernel spec (defaults when only listing shapes).
struct Assembler {
  const model::Architecture& arch;
  const model::ModelDesc& desc;
  WeightSource& weights;
  const std::vector<attn::AttentionGroup>* groups = nullptr;  // null: listing shapes only
  const layout::Geometry* geometry = nullptr;
  kernels::AttentionOrder attention_order = kernels::AttentionOrder::kFloat;

  layout::LayerGeometry layer_geometry(const std::string& layer) const;
  kernels::AttentionSpec attention_spec(const model::LayerDesc& layer) const;
  const model::LayerDesc& layer(const std::string& name) const;  // throws when absent
};

// One Llama-style attention layer: input norm, attention (sinks when the layer has them, Qwen3's
// q/k norms when asked), post-attention norm, SwiGLU MLP; under `prefix`.
struct LlamaLayerOptions {
  bool qk_norm = false;
  bool rope = true;
};
Block llama_layer(Assembler& a, const model::LayerDesc& l, const std::string& prefix,
                  LlamaLayerOptions options = {});
// The attention mixer's weights of layer `l` (q, k, v, o, sinks, q/k norms), in that order.
std::unique_ptr<Attention> attention_mixer(Assembler& a, const model::LayerDesc& l,
                                           const std::string& prefix, LlamaLayerOptions options);
// Numerics::kGgml for a layer read from a GGUF file in the kGgml weight order whose attention
// ggml_attention serves; kMixkv otherwise (the one place this choice is made).
Numerics numerics_of(const Assembler& a, const model::LayerDesc& l);
// A SwiGLU or GELU-tanh gated MLP of the architecture's intermediate size.
std::unique_ptr<Mlp> gated_mlp(Assembler& a, const std::string& prefix, Mlp::Activation act);

// The target's families: each builds Network::blocks, embed, final_norm, lm_head and its own
// scalings. Chosen once, by the architecture's model_type.
using BuildTarget = void (*)(Assembler& a, Network& net);
void build_llama(Assembler& a, Network& net);
void build_qwen3_next(Assembler& a, Network& net);
void build_gemma2(Assembler& a, Network& net);
void build_nemotron_h(Assembler& a, Network& net);
struct Family {
  const NameTable& names;
  BuildTarget build;
};
Family family_of(const model::Architecture& arch);

// Embedding, final norm and LM head (tied or not) in the family's names: the embedding first,
// then `layers` (which builds the blocks), then the final norm and the head, as checkpoints
// list them.
template <typename Layers>
void build_model(Assembler& a, Network& net, Layers&& layers) {
  const model::Architecture& c = a.arch;
  net.eps = c.rms_norm_eps;
  net.embed = a.weights.model_matrix(Role::kTokenEmbd, c.vocab_size, c.hidden_size);
  layers();
  net.final_norm = a.weights.model(Role::kOutputNorm, {c.hidden_size});
  net.lm_head = c.tie_word_embeddings
                    ? net.embed
                    : a.weights.model_matrix(Role::kOutput, c.vocab_size, c.hidden_size);
}

// The drafter head and layers (heads.cpp): EAGLE-style, MTP, or DFlash, from desc.draft_info.
void build_drafter(Assembler& a, Network& net);

}  // namespace mixkv::runner
