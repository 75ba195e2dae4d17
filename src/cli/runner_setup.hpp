// How `generate` and `serve` turn MODEL and --draft into a runner: a tiny model (generated
// weights) or a checkpoint directory, a drafter model whose layers join the target's plan, or the
// target's own MTP layers; then the drafter object that proposes tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "mixkv/model/describe.hpp"
#include "mixkv/runner/model_runner.hpp"
#include "mixkv/spec/drafter.hpp"

namespace mixkv::cli {

struct RunnerSetup {
  model::ModelSource source;
  weights::TensorMap weights;
  runner::RunnerOptions options;
};

// MODEL and --draft (empty: none) as a runner's config, weights and options. Throws Error naming
// the model or drafter that is unknown or does not fit the target.
RunnerSetup prepare_runner(const std::string& model, const std::string& draft, int num_spec_tokens,
                           std::int64_t memory_bytes);

// The drafter object for --draft over `runner` (built from prepare_runner's result): ngram,
// random (seeded), mtp, a drafter model (EAGLE-style or DFlash). Null for an empty --draft.
// "oracle" needs the plain outputs and is the caller's; any other name is an Error.
std::unique_ptr<spec::Drafter> make_drafter(const std::string& draft, runner::ModelRunner& runner,
                                            std::uint64_t seed);

bool is_directory(const std::string& ref);

}  // namespace mixkv::cli
