// The `mixkv` command line: a thin shell over the library. Output goes to `out`, diagnostics to
// `err`; the return value is the process exit status (0 ok, 2 bad usage or input, 1 internal,
// 3 `verify` found a mismatch, or `generate`'s speculative tokens differ from plain ones).
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

#include "mixkv/sample/sampler.hpp"

namespace CLI {
class App;
}

namespace mixkv::cli {

int run(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// Each command registers its subcommand on `app` and returns the action to run when chosen.
using Action = std::function<void(std::ostream& out)>;
Action add_describe_command(CLI::App& app);
Action add_models_command(CLI::App& app);
Action add_plan_command(CLI::App& app);
Action add_verify_command(CLI::App& app);
Action add_simulate_command(CLI::App& app);
Action add_generate_command(CLI::App& app);
Action add_bench_generate_command(CLI::App& app);
Action add_tokenize_command(CLI::App& app);
Action add_detokenize_command(CLI::App& app);
Action add_serve_command(CLI::App& app);

// Adds `--seed`-style option `name` that reads a decimal integer from 0 to 2^64 - 1 into `seed`;
// anything else (a sign, a larger number, trailing text) is a usage error (exit 2), not the
// saturated or wrapped value a plain unsigned option would keep.
void add_seed_option(CLI::App& cmd, const std::string& name, std::uint64_t& seed,
                     const std::string& description);

// Adds the sampling options (--temperature, --top-k, --top-p, --min-p, --repetition-penalty,
// --presence-penalty, --frequency-penalty) into `params`; their ranges are sample::validate's.
void add_sampling_options(CLI::App& cmd, sample::SamplingParams& params);

// `--num-spec-tokens` with a drafter, the same in every command: throws InvalidInput naming the
// flag unless 1 <= k <= sched::kMaxDraftTokens.
void check_num_spec_tokens(int k);

// Thrown by an action whose output is complete but whose exit status is not 0 (`verify`: 3 on a
// mismatch).
struct ExitStatus {
  int code = 0;
};

}  // namespace mixkv::cli
