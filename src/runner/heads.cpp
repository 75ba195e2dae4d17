// The drafter heads beside the target: EAGLE-style (fc over [embedding; hidden state], decoder
// layers, norm), the target's own MTP layers (Qwen3-Next: the two halves RMS-normalised before
// fc) and DFlash (fc over the chosen target layers' states, hidden_norm, non-causal layers with
// Qwen3's q/k norms, norm). They share the target's embedding and LM head.
#include "runner/family.hpp"

namespace mixkv::runner {

void build_drafter(Assembler& a, Network& net) {
  const model::DraftInfo& info = *a.desc.draft_info;
  const bool mtp = info.kind == model::DraftKind::kMtp;
  const bool dflash = info.kind == model::DraftKind::kDflash;
  const std::int64_t h = a.arch.hidden_size;
  const std::string p = mtp ? "mtp." : "draft.";
  WeightSource& w = a.weights;
  // DFlash projects the concatenated outputs of its target layers; EAGLE and MTP a token's
  // embedding beside one hidden state.
  const auto fc_in = dflash ? static_cast<std::int64_t>(info.target_layer_ids.size()) * h : 2 * h;
  net.draft_eps = a.arch.rms_norm_eps;
  net.draft_fc = w.head_matrix(p, Role::kDraftFc, h, fc_in);
  if (mtp) {
    net.mtp_norm_embedding = w.head(p, Role::kMtpNormEmbedding, {h});
    net.mtp_norm_hidden = w.head(p, Role::kMtpNormHidden, {h});
  }
  if (dflash) net.dflash_hidden_norm = w.head(p, Role::kDraftHiddenNorm, {h});
  for (const model::LayerDesc& l : a.desc.layers) {
    if (l.owner != model::Owner::kDraft) continue;
    net.draft_blocks.push_back(llama_layer(a, l, l.name + ".", {.qk_norm = dflash}));
  }
  if (dflash) {
    for (const Block& b : net.draft_blocks) {
      net.dflash_attention.push_back(static_cast<const Attention*>(b.mixer.get()));
    }
  }
  net.draft_norm = w.head(p, Role::kDraftNorm, {h});
}

}  // namespace mixkv::runner
