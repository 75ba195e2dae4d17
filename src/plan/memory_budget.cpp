#include "mixkv/plan/memory_budget.hpp"

#include <array>
#include <cctype>
#include <cmath>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "mixkv/core/error.hpp"

namespace mixkv::plan {
namespace {

// nvidia-smi totals (MiB x 2^20), shared/design/model-facts.md §11.
constexpr std::array kGpus = {
    Gpu{"h100", 85'520'809'984},
    Gpu{"h200", 150'754'820'096},
    Gpu{"b200", 192'265'846'784},
    Gpu{"b300", 288'400'343'040},
};

struct Unit {
  std::string_view suffix;
  double bytes;
};
constexpr std::array kUnits = {
    Unit{"b", 1},
    Unit{"kib", 1024.0},
    Unit{"mib", 1048576.0},
    Unit{"gib", 1073741824.0},
    Unit{"tib", 1099511627776.0},
    Unit{"kb", 1e3},
    Unit{"mb", 1e6},
    Unit{"gb", 1e9},
    Unit{"tb", 1e12},
    Unit{"k", 1024.0},
    Unit{"m", 1048576.0},
    Unit{"g", 1073741824.0},
    Unit{"t", 1099511627776.0},
};

}  // namespace

std::int64_t parse_memory_size(std::string_view text) {
  std::string lower;
  for (char c : text) {
    if (!std::isspace(static_cast<unsigned char>(c)))
      lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  std::size_t digits = 0;
  while (digits < lower.size() &&
         (std::isdigit(static_cast<unsigned char>(lower[digits])) || lower[digits] == '.')) {
    ++digits;
  }
  const std::string number = lower.substr(0, digits);
  const std::string suffix = lower.substr(digits);
  double scale = 0;
  if (suffix.empty()) {
    scale = 1;
  } else {
    for (const auto& u : kUnits) {
      if (u.suffix == suffix) scale = u.bytes;
    }
  }
  double value = 0;
  bool parsed = !number.empty() && number.find('.') == number.rfind('.');
  if (parsed) {
    try {
      value = std::stod(number);
    } catch (const std::exception&) {
      parsed = false;
    }
  }
  if (!parsed || scale == 0) {
    throw_invalid(
        fmt::format("memory size '{}' is not understood; write bytes or a number with a unit, e.g. "
                    "40GiB, 512MiB or 80GB",
                    text));
  }
  const double bytes = std::floor(value * scale);
  if (!(bytes >= 1) || bytes > 9.0e18) {
    throw_invalid(fmt::format("memory size '{}' must be at least 1 byte and below 8 EiB", text));
  }
  return static_cast<std::int64_t>(bytes);
}

std::span<const Gpu> gpus() { return kGpus; }

const Gpu& find_gpu(std::string_view name) {
  for (const auto& gpu : kGpus) {
    if (gpu.name == name) return gpu;
  }
  std::vector<std::string_view> names;
  for (const auto& gpu : kGpus) names.push_back(gpu.name);
  throw_invalid(
      fmt::format("unknown GPU '{}'; known: {} (or give --memory)", name, fmt::join(names, ", ")));
}

MemoryBudget budget_for_gpu(const Gpu& gpu, double utilization, const model::ModelDesc& desc) {
  if (!(utilization > 0 && utilization <= 1)) {
    throw_invalid(fmt::format("--gpu-memory-utilization {} must be in (0, 1]", utilization));
  }
  if (!desc.facts.weight_bytes) {
    throw_invalid(fmt::format(
        "model {} has no weight estimate (a model file without facts); give --memory instead "
        "of --gpu",
        desc.model));
  }
  const auto usable = static_cast<std::int64_t>(std::floor(double(gpu.bytes) * utilization));
  const std::int64_t weights = *desc.facts.weight_bytes;
  MemoryBudget budget;
  budget.kv_bytes = usable - weights;
  budget.explanation = fmt::format(
      "{} {:.2f} GiB x {} = {:.2f} GiB, minus weights {:.2f} GiB per rank ({}); "
      "activations and CUDA graphs are not subtracted",
      gpu.name, double(gpu.bytes) / double(1 << 30), utilization, double(usable) / double(1 << 30),
      double(weights) / double(1 << 30), desc.facts.weight_estimate);
  if (budget.kv_bytes <= 0) {
    throw_invalid(
        fmt::format("model {} does not fit: {}; leaves no memory for the KV cache. Use more tensor "
                    "parallelism (--tp), a larger GPU or --memory",
                    desc.model, budget.explanation));
  }
  return budget;
}

}  // namespace mixkv::plan
