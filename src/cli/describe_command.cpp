#include <CLI/CLI.hpp>
#include <ostream>

#include "cli.hpp"
#include "layer_table.hpp"
#include "mixkv/model/model_json.hpp"
#include "model_options.hpp"

namespace mixkv::cli {

Action add_describe_command(CLI::App& app) {
  struct Args {
    ModelArgs model;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "describe", "Print what every layer of a model (and its drafter) needs from the KV cache");
  cmd->footer(
      "MODEL and --draft take a built-in name (see `mixkv models`), a HuggingFace config.json (or "
      "its "
      "directory), or a native mixkv model file (docs/model-file.md). Numbers are per "
      "tensor-parallel rank.");
  add_model_options(*cmd, args->model);
  cmd->add_flag("--json", args->json, "Print the JSON document (the native model-file format)");

  return [args](std::ostream& out) {
    const model::ModelDesc desc = describe_from_args(args->model);
    if (args->json) {
      out << model::to_json(desc).dump(2) << '\n';
    } else {
      out << format_layer_table(desc);
    }
  };
}

}  // namespace mixkv::cli
