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

const bool kRegistered = [] {
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
