// ModelFacts for a described model: the target's raw numbers and an estimate of the weight bytes
// each tensor-parallel rank holds (target + drafter), which the planner subtracts from device
// memory before sizing the KV cache. The estimate counts parameters from config shapes; it never
// reads a checkpoint.
#pragma once

#include <cstddef>
#include <optional>

#include "config_reader.hpp"
#include "layer_template.hpp"
#include "mixkv/model/model.hpp"

namespace mixkv::model {

// A drafter as the estimate sees it.
struct DrafterShape {
  DraftKind kind = DraftKind::kModel;
  // Its own config and layers. For kMtp both are null: the layers are the target's mtp_layers.
  const ConfigReader* config = nullptr;
  const FamilyLayers* family = nullptr;
  std::size_t num_target_layer_ids = 0;  // DFlash: target hidden states concatenated into its fc
};

// The target's facts, and weight_bytes per rank for target + drafter split evenly over `tp`.
// Does not throw: when the config lacks a field the estimate needs (or its numbers overflow),
// weight_bytes is nullopt and weight_estimate says why, because the cache shapes stay useful
// without it.
ModelFacts model_facts(const ConfigReader& target_root, const FamilyLayers& target,
                       const std::optional<DrafterShape>& draft, int tp);

}  // namespace mixkv::model
