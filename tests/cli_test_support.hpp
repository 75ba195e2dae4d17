// Runs the `mixkv` command line in-process and captures what it prints. Shared by the CLI tests.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "cli/cli.hpp"

namespace mixkv::testing {

struct CliResult {
  int status = 0;
  std::string out;
  std::string err;
};

// `command` (e.g. "plan") is put before `args`; pass "" to run `args` as they are.
inline CliResult run_cli(const std::string& command, std::vector<std::string> args) {
  if (!command.empty()) args.insert(args.begin(), command);
  std::ostringstream out, err;
  const int status = cli::run(args, out, err);
  return {status, out.str(), err.str()};
}

}  // namespace mixkv::testing
