#include "cli.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <limits>
#include <ostream>

#include "mixkv/core/error.hpp"
#include "mixkv/sched/scheduler.hpp"

namespace mixkv::cli {

void add_seed_option(CLI::App& cmd, const std::string& name, std::uint64_t& seed,
                     const std::string& description) {
  cmd.add_option_function<std::string>(
         name,
         [&seed, name](const std::string& text) {
           std::uint64_t value = 0;
           const char* end = text.data() + text.size();
           const auto [at, ec] = std::from_chars(text.data(), end, value);
           if (text.empty() || ec != std::errc{} || at != end) {
             throw CLI::ValidationError(
                 name, fmt::format("'{}' is not a seed; give an integer from 0 to {}", text,
                                   std::numeric_limits<std::uint64_t>::max()));
           }
           seed = value;
         },
         description)
      ->default_str(std::to_string(seed));
}

void check_num_spec_tokens(int k) {
  if (k < 1 || k > sched::kMaxDraftTokens) {
    throw_invalid(fmt::format("--num-spec-tokens {} is out of range; use 1 to {}", k,
                              sched::kMaxDraftTokens));
  }
}

void add_sampling_options(CLI::App& cmd, sample::SamplingParams& params) {
  cmd.add_option("--temperature", params.temperature,
                 "Sampling temperature; 0 (the default) is greedy")
      ->capture_default_str();
  cmd.add_option("--top-k", params.top_k, "Sample among the k likeliest tokens; 0 or -1: all")
      ->capture_default_str();
  cmd.add_option("--top-p", params.top_p,
                 "Sample among the likeliest tokens holding this probability, in (0, 1]")
      ->capture_default_str();
  cmd.add_option("--min-p", params.min_p,
                 "Drop tokens less likely than this fraction of the likeliest, in [0, 1]")
      ->capture_default_str();
  cmd.add_option("--repetition-penalty", params.repetition_penalty,
                 "Penalty on prompt and output tokens (> 0; 1: none)")
      ->capture_default_str();
  cmd.add_option("--presence-penalty", params.presence_penalty,
                 "Subtracted from output tokens' logits once, in [-2, 2]")
      ->capture_default_str();
  cmd.add_option("--frequency-penalty", params.frequency_penalty,
                 "Subtracted from output tokens' logits per occurrence, in [-2, 2]")
      ->capture_default_str();
}

int run(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  CLI::App app{
      "mixkv: KV-cache planning and management for mixed-layer LLMs with speculative drafters",
      "mixkv"};
  app.set_version_flag("--version", "mixkv 0.1.0");
  app.require_subcommand(1);
  std::vector<std::pair<CLI::App*, Action>> commands;
  auto add = [&](Action (*adder)(CLI::App&)) {
    Action action = adder(app);
    commands.emplace_back(app.get_subcommands({}).back(), std::move(action));
  };
  add(add_models_command);
  add(add_describe_command);
  add(add_plan_command);
  add(add_verify_command);
  add(add_simulate_command);
  add(add_generate_command);
  add(add_bench_generate_command);
  add(add_tokenize_command);
  add(add_detokenize_command);
  add(add_serve_command);

  try {
    std::vector<std::string> reversed(args.rbegin(),
                                      args.rend());  // CLI11 parses a reversed vector
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    out << app.help();  // shows the chosen subcommand's help when there is one
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    out << app.help("", CLI::AppFormatMode::All);
    return 0;
  } catch (const CLI::CallForVersion&) {
    out << app.version() << '\n';
    return 0;
  } catch (const CLI::ParseError& e) {
    // With no command chosen, CLI11 reports a first word it does not know as a missing command;
    // name the word instead.
    if (!args.empty() && !args.front().starts_with("-") && app.get_subcommands().empty()) {
      std::vector<std::string> names;
      for (const auto& [sub, action] : commands) names.push_back(sub->get_name());
      err << fmt::format("mixkv: unknown command '{}'; the commands are {}\n", args.front(),
                         fmt::join(names, ", "))
          << "Run 'mixkv --help' for usage.\n";
      return 2;
    }
    err << "mixkv: " << e.what() << "\nRun 'mixkv --help' for usage.\n";
    return 2;
  }

  try {
    for (auto& [sub, action] : commands) {
      if (sub->parsed()) action(out);
    }
    return 0;
  } catch (const ExitStatus& e) {
    return e.code;
  } catch (const Error& e) {
    err << "mixkv: error: " << e.what() << '\n';
    return e.exit_code();
  } catch (const std::exception& e) {
    err << "mixkv: internal error: " << e.what() << '\n';
    return 1;
  }
}

}  // namespace mixkv::cli
