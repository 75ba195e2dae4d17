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

// Host memory the CPU kernels may allocate for a plan's cache tensors (`verify`'s scaled plan,
// the reference engine's cache): a cache larger than this on the host is a size typed wrong
// (docs/planning.md). Checked before anything is allocated.
inline constexpr std::int64_t kMaxHostCacheBytes = std::int64_t{16} << 30;  // 16 GiB
// Throws Error(kInvalidInput) when `bytes`, the tensors `who` would allocate, exceed
// kMaxHostCacheBytes; the message names `option`, which sets them.
void check_host_cache_bytes(std::int64_t bytes, std::string_view who, std::string_view option);

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
