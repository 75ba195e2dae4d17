// Human-readable per-layer table for `mixkv describe`: identical layers folded into one row.
#pragma once

#include <string>
#include <vector>

#include "mixkv/model/model.hpp"

namespace mixkv::cli {

// "0-2,4-6" for runs, "3..47 step 4" for an arithmetic progression.
std::string compact_indices(const std::vector<int>& sorted_indices);

std::string format_layer_table(const model::ModelDesc& desc);

// For a self-speculative drafter (DraftKind::kSelf), one line saying which target layers it runs
// and that their cache is shared (no byte of its own); empty otherwise. describe and plan print it.
std::string self_draft_note(const model::ModelDesc& desc);

}  // namespace mixkv::cli
