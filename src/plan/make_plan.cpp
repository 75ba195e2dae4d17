#include <fmt/format.h>
#include <fmt/ranges.h>

#include "layout.hpp"
#include "mixkv/core/error.hpp"

namespace mixkv::plan {

CachePlan make_plan(const model::ModelDesc& desc, const PlanOptions& in) {
  model::validate(desc);
  PlanOptions options = in;
  if (options.memory_bytes <= 0) {
    throw_invalid(
        fmt::format("memory for the KV cache is {} B; give a positive --memory (e.g. 40GiB)",
                    options.memory_bytes));
  }
  if (options.max_model_len == 0) {
    options.max_model_len = desc.facts.max_position_embeddings.value_or(0);
    if (options.max_model_len == 0) {
      throw_invalid(fmt::format("model {} states no max_position_embeddings; give --max-model-len",
                                desc.model));
    }
  }
  if (options.max_model_len < 1)
    throw_invalid(fmt::format("--max-model-len is {}, expected >= 1", options.max_model_len));
  if (options.request_len < 1)
    throw_invalid(fmt::format("--request-len is {}, expected >= 1", options.request_len));
  if (options.block_size && (*options.block_size < 16 || *options.block_size % 16 != 0)) {
    throw_invalid(fmt::format("--block-size {} is not a positive multiple of 16 tokens",
                              *options.block_size));
  }

  std::vector<LayerSpec> specs;
  for (const auto& layer : desc.layers) specs.push_back(layer_spec(layer));
  if (options.block_size) {
    // A user block size must split into kernel pages every attention layer's backend accepts.
    const backend::ModelTraits traits = backend::model_traits(desc);
    for (std::size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].behaviour == Behaviour::kRecurrent) continue;
      const backend::KernelPageRule rule =
          backend::kernel_page_rule(options.backend, desc.layers[i], traits);
      if (!backend::select_kernel_page(rule, *options.block_size)) {
        throw_invalid(fmt::format(
            "--block-size {}: the {} backend ({}) cannot split it into kernel pages for layer {} "
            "(it accepts {}); choose a multiple of {}",
            *options.block_size, backend::to_string(options.backend), rule.serving_kernel,
            desc.layers[i].name,
            rule.multiple_of > 0 ? fmt::format("multiples of {}", rule.multiple_of)
                                 : fmt::format("{}", fmt::join(rule.sizes, ", ")),
            rule.grain()));
      }
    }
  }

  if (options.policy == Policy::kVllm)
    return finish_plan(desc, options, vllm_layout(desc, options, specs));
  // vLLM's block unit is one of mixkv's candidates, so mixkv never does worse where vLLM plans.
  std::int64_t vllm_unit = 0;
  try {
    vllm_unit = vllm_layout(desc, options, specs).unit_bytes;
  } catch (const Error&) {
    vllm_unit = 0;  // vLLM cannot plan this model; mixkv searches without the hint
  }
  return finish_plan(desc, options, mixkv_layout(desc, options, specs, vllm_unit));
}

}  // namespace mixkv::plan
