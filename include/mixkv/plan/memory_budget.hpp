// How many bytes the KV cache gets: an explicit size ("40GiB"), or a GPU's memory times the
// utilization minus the model's (estimated) weights on one tensor-parallel rank.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "mixkv/model/model.hpp"

namespace mixkv::plan {

// "42949672960", "40GiB", "40 GiB", "512MiB", "80GB" (decimal), "1.5TiB". Throws Error otherwise.
std::int64_t parse_memory_size(std::string_view text);

struct Gpu {
  std::string_view name;
  std::int64_t bytes;  // total memory as nvidia-smi reports it
};
std::span<const Gpu> gpus();
const Gpu& find_gpu(std::string_view name);  // throws Error listing the known GPUs

struct MemoryBudget {
  std::int64_t kv_bytes = 0;
  std::string explanation;  // how kv_bytes was obtained, for the report
};

// gpu.bytes x utilization - weight bytes per rank (from ModelDesc::facts). Throws when the
// weights are unknown or do not leave room for a cache.
MemoryBudget budget_for_gpu(const Gpu& gpu, double utilization, const model::ModelDesc& desc);

}  // namespace mixkv::plan
