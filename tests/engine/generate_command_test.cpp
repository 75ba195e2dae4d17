// `mixkv generate`: plain and speculative runs agree, --json gives one object per request, and
// bad input is an error with exit status 2.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_test_support.hpp"
#include "mixkv/engine/model_runner.hpp"

namespace mixkv {
namespace {

using testing::run_cli;

std::vector<nlohmann::json> json_lines(const std::string& out) {
  std::vector<nlohmann::json> objects;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) objects.push_back(nlohmann::json::parse(line));
  return objects;
}

// An empty directory under the system's temporary one, named per test run.
std::filesystem::path fresh_directory(const std::string& prefix) {
  const auto dir = std::filesystem::temp_directory_path() /
                   (prefix + std::to_string(::testing::UnitTest::GetInstance()->random_seed()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

TEST(GenerateCommand, OracleDraftGivesThePlainTokensAndFullAcceptance) {
  const auto r = run_cli("generate", {"tiny-swa", "--draft", "oracle", "--num-spec-tokens", "4",
                                      "--prompt", "hello", "--max-tokens", "21", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto lines = json_lines(r.out);
  ASSERT_EQ(lines.size(), 1u);
  const auto& j = lines[0];
  ASSERT_EQ(j["tokens"].size(), 21u);
  EXPECT_EQ(j["stats"]["identical_to_plain"], true);
  EXPECT_EQ(j["stats"]["acceptance_rate"], 1.0);
  EXPECT_EQ(j["stats"]["mean_accepted_length"], 5.0);  // 20 decode tokens in 4 steps of 1 + 4
  EXPECT_EQ(j["stats"]["prompt_tokens"], 5);
  EXPECT_GT(j["stats"]["plain_tokens_per_second"].get<double>(), 0);
  const auto ids = j["tokens"].get<std::vector<engine::TokenId>>();
  // The text is the bytes as UTF-8, invalid sequences replaced by U+FFFD (random weights emit
  // any byte); the ids are exact.
  const std::string want =
      nlohmann::json::parse(nlohmann::json(engine::decode_bytes(ids))
                                .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace))
          .get<std::string>();
  EXPECT_EQ(j["text"], want);

  // The same tokens without a drafter, and given as ids.
  const auto plain = run_cli("generate", {"tiny-swa", "--prompt-ids", "104", "101", "108", "108",
                                          "111", "--max-tokens", "21", "--json"});
  ASSERT_EQ(plain.status, 0) << plain.err;
  EXPECT_EQ(json_lines(plain.out)[0]["tokens"], j["tokens"]);
  EXPECT_FALSE(json_lines(plain.out)[0]["stats"].contains("drafter"));
}

TEST(GenerateCommand, BatchPrintsOneObjectPerRequestAndRandomDraftsChangeNothing) {
  const auto r = run_cli("generate", {"tiny-swa", "--draft", "random", "--batch", "4",
                                      "--max-tokens", "12", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto lines = json_lines(r.out);
  ASSERT_EQ(lines.size(), 4u);
  std::set<std::int64_t> lengths;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i]["request"], i);
    EXPECT_EQ(lines[i]["tokens"].size(), 12u);
    EXPECT_EQ(lines[i]["stats"]["identical_to_plain"], true);
    EXPECT_LT(lines[i]["stats"]["acceptance_rate"].get<double>(), 0.2);
    lengths.insert(lines[i]["stats"]["prompt_tokens"].get<std::int64_t>());
  }
  EXPECT_EQ(lengths.size(), 4u);  // mixed prompt lengths
}

TEST(GenerateCommand, TinyEagleDraftsThroughTheSharedCache) {
  const auto r = run_cli("generate", {"tiny-swa", "--draft", "tiny-eagle", "--num-spec-tokens", "3",
                                      "--max-tokens", "16", "--batch", "2", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  for (const auto& j : json_lines(r.out)) {
    EXPECT_EQ(j["stats"]["drafter"], "eagle");
    EXPECT_EQ(j["stats"]["identical_to_plain"], true);
    EXPECT_GT(j["stats"]["drafted_tokens"].get<int>(), 0);
  }
  const auto wrong = run_cli("generate", {"tiny-swa", "--draft", "tiny-swa"});
  EXPECT_EQ(wrong.status, 2);
  EXPECT_NE(wrong.err.find("not for tiny-swa"), std::string::npos) << wrong.err;
}

TEST(GenerateCommand, TinyHybridDraftsWithItsMtpLayer) {
  const auto r = run_cli("generate", {"tiny-hybrid", "--draft", "mtp", "--num-spec-tokens", "2",
                                      "--max-tokens", "16", "--batch", "2", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const auto lines = json_lines(r.out);
  ASSERT_EQ(lines.size(), 2u);
  for (const auto& j : lines) {
    EXPECT_EQ(j["stats"]["drafter"], "mtp");
    EXPECT_EQ(j["stats"]["identical_to_plain"], true);
    EXPECT_GT(j["stats"]["drafted_tokens"].get<int>(), 0);
  }
  // tiny-swa declares no MTP layer.
  const auto none = run_cli("generate", {"tiny-swa", "--draft", "mtp"});
  EXPECT_EQ(none.status, 2);
  EXPECT_NE(none.err.find("no MTP layers"), std::string::npos) << none.err;
}

TEST(GenerateCommand, TinyDflashDraftsABlockForEitherTinyTarget) {
  for (const char* target : {"tiny-swa", "tiny-hybrid"}) {
    const auto r = run_cli("generate", {target, "--draft", "tiny-dflash", "--num-spec-tokens", "7",
                                        "--max-tokens", "16", "--batch", "2", "--json"});
    ASSERT_EQ(r.status, 0) << target << ": " << r.err;
    const auto lines = json_lines(r.out);
    ASSERT_EQ(lines.size(), 2u) << target;
    for (const auto& j : lines) {
      EXPECT_EQ(j["stats"]["drafter"], "dflash");
      EXPECT_EQ(j["stats"]["identical_to_plain"], true);
      EXPECT_GT(j["stats"]["drafted_tokens"].get<int>(), 0);
    }
  }
  // A block holds the anchor and at most block_size - 1 = 7 drafts.
  const auto big =
      run_cli("generate", {"tiny-swa", "--draft", "tiny-dflash", "--num-spec-tokens", "8"});
  EXPECT_EQ(big.status, 2);
  EXPECT_NE(big.err.find("use --num-spec-tokens 7 or less"), std::string::npos) << big.err;
}

TEST(GenerateCommand, HumanReportShowsBothSpeeds) {
  const auto r = run_cli("generate", {"tiny-swa", "--draft", "oracle", "--max-tokens", "8"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("plain"), std::string::npos);
  EXPECT_NE(r.out.find("oracle"), std::string::npos);
  EXPECT_NE(r.out.find("identical to plain"), std::string::npos);
  EXPECT_NE(r.out.find("tokens/s"), std::string::npos);
}

TEST(GenerateCommand, ReadsACheckpointDirectory) {
  const auto dir = fresh_directory("mixkv_gen_");
  const engine::TinyModel& m = *engine::find_tiny_model("tiny-swa");
  const auto src = engine::tiny_model_source(m);
  weights::write_safetensors(
      (dir / "model.safetensors").string(),
      engine::generate_weights(engine::read_transformer_config(src),
                               model::describe(src, std::nullopt, {}), m.seed));
  std::ofstream(dir / "config.json") << m.config_json;
  const auto from_dir =
      run_cli("generate", {dir.string(), "--prompt", "abc", "--max-tokens", "10", "--json"});
  const auto tiny =
      run_cli("generate", {"tiny-swa", "--prompt", "abc", "--max-tokens", "10", "--json"});
  ASSERT_EQ(from_dir.status, 0) << from_dir.err;
  EXPECT_EQ(json_lines(from_dir.out)[0]["tokens"], json_lines(tiny.out)[0]["tokens"]);
  std::filesystem::remove(dir / "model.safetensors");
  const auto missing = run_cli("generate", {dir.string()});
  EXPECT_EQ(missing.status, 2);
  EXPECT_NE(missing.err.find("model.safetensors"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(GenerateCommand, ReadsADrafterCheckpointDirectory) {
  const auto dir = fresh_directory("mixkv_draft_");
  // tiny-dflash's weights as its own checkpoint names them: without the draft. prefix.
  const engine::TinyModel& target = *engine::find_tiny_model("tiny-swa");
  const engine::TinyModel& d = *engine::find_tiny_model("tiny-dflash");
  const auto src = engine::tiny_model_source(target);
  const auto draft = engine::tiny_model_source(d);
  model::DescribeOptions opt;
  opt.num_spec_tokens = 3;
  weights::TensorMap own;
  for (auto& [name, t] : engine::generate_draft_weights(engine::read_transformer_config(draft),
                                                        model::describe(src, draft, opt), d.seed)) {
    own.emplace(name.substr(std::string("draft.").size()), t);
  }
  weights::write_safetensors((dir / "model.safetensors").string(), own);
  std::ofstream(dir / "config.json") << d.config_json;
  const auto r = run_cli("generate", {"tiny-swa", "--draft", dir.string(), "--max-tokens", "12",
                                      "--batch", "2", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  for (const auto& j : json_lines(r.out)) {
    EXPECT_EQ(j["stats"]["drafter"], "dflash");
    EXPECT_EQ(j["stats"]["identical_to_plain"], true);
  }
  // A checkpoint missing a tensor is refused, naming it with the prefix the runner reads.
  own.erase("hidden_norm.weight");
  weights::write_safetensors((dir / "model.safetensors").string(), own);
  const auto missing = run_cli("generate", {"tiny-swa", "--draft", dir.string()});
  EXPECT_EQ(missing.status, 2);
  EXPECT_NE(missing.err.find("draft.hidden_norm.weight"), std::string::npos) << missing.err;
  std::filesystem::remove_all(dir);
}

TEST(GenerateCommand, BadInputIsAnErrorWithStatusTwo) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"no-such-model"},
           {"tiny-hybrid", "--draft", "tiny-eagle"},
           {"tiny-dflash", "--draft", "tiny-dflash"},
           {"tiny-swa", "--draft", "eagle-from-nowhere"},
           {"tiny-swa", "--batch", "0"},
           {"tiny-swa", "--max-tokens", "0"},
           {"tiny-swa", "--prompt-ids", "300"},
           {"tiny-swa", "--max-tokens", "5000"},
       }) {
    const auto r = run_cli("generate", args);
    EXPECT_EQ(r.status, 2) << args[0] << " " << (args.size() > 1 ? args[1] : "") << ": " << r.err;
    EXPECT_NE(r.err.find("error"), std::string::npos) << r.err;
  }
  EXPECT_EQ(run_cli("generate", {"tiny-swa", "--prompt", "a", "--prompt-ids", "1"}).status, 2);
}

}  // namespace
}  // namespace mixkv
