// `mixkv tokenize MODEL TEXT` and `mixkv detokenize MODEL IDS...`: the model's own tokenizer, for
// debugging prompts and replies. MODEL is a GGUF file, a fetched model (smollm2-135m) or a tiny
// model (its byte vocabulary).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <ostream>

#include "cli.hpp"
#include "mixkv/core/error.hpp"
#include "mixkv/engine/tiny_models.hpp"
#include "mixkv/tokenizer/byte_tokenizer.hpp"
#include "mixkv/tokenizer/tokenizer.hpp"
#include "mixkv/weights/gguf.hpp"
#include "mixkv/weights/model_files.hpp"

namespace mixkv::cli {
namespace {

std::unique_ptr<tokenizer::Tokenizer> open_tokenizer(const std::string& ref) {
  if (engine::find_tiny_model(ref) != nullptr) return std::make_unique<tokenizer::ByteTokenizer>();
  if (auto path = weights::resolve_gguf(ref)) {
    return tokenizer::tokenizer_from_gguf(weights::GgufFile::open(*path));
  }
  throw_invalid(
      fmt::format("'{}' has no tokenizer mixkv can read: give a GGUF file, a fetched "
                  "model (smollm2-135m) or a tiny model",
                  ref));
}

std::string json_text(const nlohmann::json& j) {
  // Token pieces may be parts of a UTF-8 character: show those bytes as U+FFFD.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

Action add_tokenize_command(CLI::App& app) {
  struct Args {
    std::string model, text;
    bool json = false, add_special = false, no_parse_special = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd =
      app.add_subcommand("tokenize", "Print the token ids of TEXT in MODEL's vocabulary");
  cmd->add_option("model", args->model, "GGUF file, fetched model (smollm2-135m) or tiny model")
      ->required();
  cmd->add_option("text", args->text, "Text to tokenize")->required();
  cmd->add_flag("--json", args->json, "Print {\"ids\": [...], \"pieces\": [...]}");
  cmd->add_flag("--add-special", args->add_special,
                "Add the BOS/EOS the vocabulary asks for (SmolLM2 asks for none)");
  cmd->add_flag("--no-parse-special", args->no_parse_special,
                "Treat control tokens written in TEXT (\"<|im_start|>\") as plain text");
  return [args](std::ostream& out) {
    const auto tok = open_tokenizer(args->model);
    tokenizer::EncodeOptions options;
    options.add_special = args->add_special;
    options.parse_special = !args->no_parse_special;
    const std::vector<tokenizer::TokenId> ids = tok->encode(args->text, options);
    if (!args->json) {
      out << fmt::format("{}\n", fmt::join(ids, " "));
      return;
    }
    nlohmann::json pieces = nlohmann::json::array();
    for (auto id : ids) pieces.push_back(tok->token_bytes(id, true));
    out << json_text({{"ids", ids}, {"pieces", pieces}}) << '\n';
  };
}

Action add_detokenize_command(CLI::App& app) {
  struct Args {
    std::string model;
    std::vector<std::int64_t> ids;
    bool skip_special = false, json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd =
      app.add_subcommand("detokenize", "Print the text that token IDS stand for in MODEL");
  cmd->add_option("model", args->model, "GGUF file, fetched model (smollm2-135m) or tiny model")
      ->required();
  cmd->add_option("ids", args->ids, "Token ids")->required();
  cmd->add_flag("--skip-special", args->skip_special,
                "Leave out control tokens (BOS, EOS, chat markers)");
  cmd->add_flag("--json", args->json, "Print {\"text\": ..., \"pieces\": [...]}");
  return [args](std::ostream& out) {
    const auto tok = open_tokenizer(args->model);
    std::vector<tokenizer::TokenId> ids;
    for (std::int64_t id : args->ids) {
      if (id < 0 || id >= tok->vocab_size()) {
        throw_invalid(fmt::format("token id {} is outside {}'s vocabulary (0..{})", id, args->model,
                                  tok->vocab_size() - 1));
      }
      ids.push_back(static_cast<tokenizer::TokenId>(id));
    }
    const bool special = !args->skip_special;
    if (!args->json) {
      out << tok->decode(ids, special) << '\n';
      return;
    }
    nlohmann::json pieces = nlohmann::json::array();
    for (auto id : ids) pieces.push_back(tok->token_bytes(id, special));
    out << json_text({{"text", tok->decode(ids, special)}, {"pieces", pieces}}) << '\n';
  };
}

}  // namespace mixkv::cli
