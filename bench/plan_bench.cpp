// Planning time per built-in target + drafter pair, for both policies. Planning runs once at
// engine start-up; these figures show what the mixkv policy's search costs next to vLLM's rules.
#include <benchmark/benchmark.h>

#include "mixkv/builtin/builtin_models.hpp"
#include "mixkv/model/describe.hpp"
#include "mixkv/plan/plan.hpp"

namespace {

using namespace mixkv;

struct PairCase {
  std::string target;
  std::optional<std::string> draft;
};

std::vector<PairCase> pairs() {
  std::vector<PairCase> out;
  for (const auto& m : builtin::builtin_models()) {
    if (m.role == builtin::Role::kTarget) out.push_back({std::string(m.name), std::nullopt});
    for (auto t : m.targets) out.push_back({std::string(t), std::string(m.name)});
  }
  return out;
}

void BM_Plan(benchmark::State& state, const PairCase& pair, plan::Policy policy) {
  std::optional<std::string_view> draft;
  if (pair.draft) draft = *pair.draft;
  const model::ModelDesc desc = model::describe_refs(pair.target, draft, {});
  plan::PlanOptions options;
  options.policy = policy;
  options.memory_bytes = std::int64_t{80} << 30;
  for (auto _ : state) benchmark::DoNotOptimize(plan::make_plan(desc, options));
}

// A model of `layers` layers in Qwen3-Next's hybrid pattern (3 Gated DeltaNet : 1 full
// attention), up to 4,096, the most a config may declare: planning time must stay near-linear in
// the layer count (issue 12: 73 s at 4,096 layers before the search tried O(sqrt n) splits).
void BM_PlanLayers(benchmark::State& state, plan::Policy policy) {
  model::ModelDesc desc = model::describe_refs("qwen3-next-80b-a3b", std::nullopt, {});
  const std::vector<model::LayerDesc> base = desc.layers;
  desc.layers.clear();
  for (int i = 0; i < state.range(0); ++i) {
    model::LayerDesc l = base[static_cast<std::size_t>(i) % base.size()];
    l.name = "layers." + std::to_string(i);
    l.index = i;
    desc.layers.push_back(l);
  }
  plan::PlanOptions options;
  options.policy = policy;
  options.memory_bytes = std::int64_t{80} << 30;
  options.max_model_len = 8192;
  for (auto _ : state) benchmark::DoNotOptimize(plan::make_plan(desc, options));
  state.counters["layers"] = static_cast<double>(state.range(0));
}

const bool kRegistered = [] {
  for (auto [name, policy] : {std::pair{"BM_PlanLayersMixkv", plan::Policy::kMixkv},
                              std::pair{"BM_PlanLayersVllm", plan::Policy::kVllm}}) {
    benchmark::RegisterBenchmark(name, BM_PlanLayers, policy)
        ->Arg(64)
        ->Arg(400)
        ->Arg(1600)
        ->Arg(4096)
        ->Unit(benchmark::kMillisecond);
  }
  for (const auto& pair : pairs()) {
    const std::string name = pair.target + (pair.draft ? "+" + *pair.draft : "");
    benchmark::RegisterBenchmark(("BM_PlanVllm/" + name).c_str(), BM_Plan, pair,
                                 plan::Policy::kVllm)
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("BM_PlanMixkv/" + name).c_str(), BM_Plan, pair,
                                 plan::Policy::kMixkv)
        ->Unit(benchmark::kMicrosecond);
  }
  return true;
}();

}  // namespace
