// How long describing a model takes: parse the config, build every layer, shard, validate.
// Engines call this once at start-up; the figure shows it is negligible next to a model load.
#include <benchmark/benchmark.h>

#include "mixkv/builtin/builtin_models.hpp"
#include "mixkv/model/describe.hpp"
#include "mixkv/model/model_json.hpp"

namespace {

using namespace mixkv;

void BM_DescribeEveryBuiltinTarget(benchmark::State& state) {
  std::int64_t layers = 0;
  for (auto _ : state) {
    for (const auto& m : builtin::builtin_models()) {
      if (m.role != builtin::Role::kTarget) continue;
      auto desc = model::describe_refs(m.name, std::nullopt, {});
      layers += static_cast<std::int64_t>(desc.layers.size());
      benchmark::DoNotOptimize(desc);
    }
  }
  state.counters["layers/s"] =
      benchmark::Counter(static_cast<double>(layers), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_DescribeEveryBuiltinTarget);

void BM_DescribeHybridWithDrafterTp4(benchmark::State& state) {
  model::DescribeOptions options;
  options.tp = 4;
  for (auto _ : state) {
    benchmark::DoNotOptimize(model::describe_refs("qwen3.5-27b", "dflash-qwen3.5-27b", options));
  }
}
BENCHMARK(BM_DescribeHybridWithDrafterTp4);

void BM_NativeModelFileRoundTrip(benchmark::State& state) {
  const std::string text =
      model::to_json(model::describe_refs("qwen3.5-27b", "dflash-qwen3.5-27b", {})).dump();
  for (auto _ : state) {
    auto source = model::parse_model_source("file", "model.json", text);
    benchmark::DoNotOptimize(model::describe(source, std::nullopt, {}));
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(text.size()));
}
BENCHMARK(BM_NativeModelFileRoundTrip);

}  // namespace
