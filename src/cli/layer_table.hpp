// Human-readable per-layer table for `mixkv describe`: identical layers folded into one row.
#pragma once

#include <string>
#include <vector>

#include "mixkv/model/model.hpp"

namespace mixkv::cli {

// "0-2,4-6" for runs, "3..47 step 4" for an arithmetic progression.
std::string compact_indices(const std::vector<int>& sorted_indices);

std::string format_layer_table(const model::ModelDesc& desc);

}  // namespace mixkv::cli
