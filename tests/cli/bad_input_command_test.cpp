// Hostile input on the command line (issue 12 §5, in the words a user would type): each case
// ends with exit status 2 and a message naming what is wrong; none reads without bound, blocks,
// allocates what cannot be allocated or ends in an internal error.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_test_support.hpp"
#include "mixkv/model/describe.hpp"

namespace mixkv::cli {
namespace {

// A file under a directory of its own, named by the process and the test: ctest runs the tests
// as parallel processes, and gtest's time-based random seed (the name used before) could be the
// same for two of them, one removing the other's files.
std::filesystem::path scratch(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("mixkv_bad_input_" + std::to_string(::getpid()) + "_" +
                    ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::create_directories(dir);
  return dir / name;
}

void expect_bad_input(const std::vector<std::string>& args,
                      const std::vector<std::string>& needles) {
  const testing::CliResult r = testing::run_cli("", args);
  std::string line;
  for (const auto& a : args) line += a + " ";
  EXPECT_EQ(r.status, 2) << line << ": " << r.err;
  for (const auto& needle : needles) {
    EXPECT_NE(r.err.find(needle), std::string::npos)
        << line << "lacks '" << needle << "': " << r.err;
  }
  EXPECT_EQ(r.err.find("internal error"), std::string::npos) << line << ": " << r.err;
}

TEST(BadInputCommand, AnUnknownCommandIsNamed) {
  expect_bad_input({"bogus"}, {"unknown command 'bogus'", "describe", "simulate"});
  expect_bad_input({"bogus", "qwen3-8b"}, {"unknown command 'bogus'"});
}

TEST(BadInputCommand, DevicesFifosDirectoriesAndHugeFilesAreNotRead) {
  expect_bad_input({"describe", "/dev/zero"}, {"/dev/zero is a character device"});
  const auto fifo = scratch("fifo.json");
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_bad_input({"describe", fifo.string()}, {"FIFO"});
  expect_bad_input({"describe", "qwen3-8b", "--draft", fifo.string()}, {"FIFO"});
  // A model directory whose config.json is itself a directory.
  const auto dir = scratch("model_dir");
  std::filesystem::create_directories(dir / "config.json");
  expect_bad_input({"describe", dir.string()}, {"config.json is a directory"});
  // Sparse: the size is what matters, and nothing of it may be read.
  const auto huge = scratch("huge.json");
  std::ofstream(huge).close();
  std::filesystem::resize_file(huge, static_cast<std::uintmax_t>(model::kMaxConfigFileBytes) + 1);
  expect_bad_input({"describe", huge.string()}, {"huge.json is 16777217 bytes", "16 MiB"});
  std::filesystem::remove_all(fifo.parent_path());
}

TEST(BadInputCommand, NativeModelFilesKeepTheCommandLinesBoundsAndPrintableNames) {
  const testing::CliResult described = testing::run_cli("describe", {"qwen3-8b", "--json"});
  ASSERT_EQ(described.status, 0) << described.err;
  const nlohmann::json file = nlohmann::json::parse(described.out);
  const auto write = [&](const std::string& name, const nlohmann::json& doc) {
    const auto path = scratch(name);
    std::ofstream(path) << doc.dump();
    return path.string();
  };
  nlohmann::json spec = file;
  spec["num_spec_tokens"] = 1000000;
  expect_bad_input({"describe", write("spec.json", spec)},
                   {"num_spec_tokens is 1000000, expected 0 to 1024"});
  nlohmann::json tp = file;
  tp["tp"] = 100000;
  expect_bad_input({"plan", write("tp.json", tp)}, {"tp is 100000, expected 1 to 1024"});
  nlohmann::json name = file;
  name["model"] = "evil\x1b[2J";
  const testing::CliResult r = testing::run_cli("describe", {write("name.json", name)});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("\"evil\\x1b[2J\" holds control characters"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << "printed raw";
  nlohmann::json layer = file;
  layer["layers"][0]["name"] = "layers.0\n";
  expect_bad_input({"describe", write("layer.json", layer)},
                   {"layer name \"layers.0\\x0a\" holds control characters"});
  std::filesystem::remove_all(scratch("").parent_path());
}

TEST(BadInputCommand, TraceOverflowsAreRefusedNamingLineAndField) {
  const auto trace = scratch("trace.jsonl");
  std::ofstream(trace) << "{\"arrival_step\": 0, \"prompt_len\": 100, \"output_len\": 10}\n"
                       << "{\"arrival_step\": 9223372036854775807, \"prompt_len\": 100, "
                          "\"output_len\": 10}\n";
  expect_bad_input({"simulate", "qwen3-8b", "--trace", trace.string()},
                   {"trace.jsonl:2", "\"arrival_step\" is 9223372036854775807, above the limit"});
  expect_bad_input({"simulate", "qwen3-8b", "--trace", "/dev/zero"},
                   {"trace file /dev/zero is a character device"});
  std::filesystem::remove_all(trace.parent_path());
}

TEST(BadInputCommand, SizesThatCannotBeAllocatedAreRefusedWithTheBytes) {
  expect_bad_input(
      {"verify", "qwen3-8b", "--memory-scale", "1TiB"},
      {"1099509792768 bytes", "above the limit of 17179869184 bytes", "--memory-scale"});
  expect_bad_input({"simulate", "qwen3-8b", "--memory", "4000TiB", "--requests", "10"},
                   {"1864135111 blocks needs 63947290880 bytes of host metadata"});
}

// serve's --gpu budget is checked before the server listens: a budget the host cannot hold, a
// share without a GPU and a GPU beside --memory are the user's input.
TEST(BadInputCommand, ServeGpuBudgetsAreCheckedBeforeListening) {
  expect_bad_input({"serve", "tiny-swa", "--gpu", "h100"},
                   {"--gpu h100's KV budget", "16 GiB", "--gpu-memory-utilization, or --memory"});
  expect_bad_input({"serve", "tiny-swa", "--gpu-memory-utilization", "0.5"},
                   {"--gpu-memory-utilization", "--gpu"});
  expect_bad_input({"serve", "tiny-swa", "--gpu", "h100", "--memory", "64MiB"},
                   {"--gpu", "--memory"});
  expect_bad_input({"serve", "tiny-swa", "--gpu", "a100"}, {"a100", "h100"});
}

// --draft-layers 0 is a count the user wrote, not "the default": each command that takes it
// refuses it; a target whose first layer is recurrent says no layer count helps.
TEST(BadInputCommand, SelfDrafterLayerCountsAreChecked) {
  for (const char* command : {"generate", "bench-generate"}) {
    expect_bad_input({command, "tiny-swa", "--draft", "self", "--draft-layers", "0"},
                     {"--draft-layers 0", "1 to 3 of tiny-swa's 4 layers"});
  }
  expect_bad_input({"generate", "tiny-hybrid", "--draft", "self"},
                   {"layers.0 is gdn", "first layer is recurrent: choose another drafter"});
}

// --attention-order bf16-pairs over a layer that cannot take it (tiny-swa: a float32 cache,
// heads of 16) names the layer, what it lacks and the fix, in every command that runs a model.
TEST(BadInputCommand, TheBf16PairAttentionOrderNamesTheLayerItCannotServe) {
  for (const char* command : {"generate", "bench-generate", "serve"}) {
    std::vector<std::string> args = {command, "tiny-swa", "--attention-order", "bf16-pairs"};
    if (std::string(command) == "serve") {
      args.insert(args.end(), {"--port", "0"});  // any free port: it listens while loading
    } else {
      args.insert(args.end(), {"--max-tokens", "2"});
    }
    expect_bad_input(args, {"layer layers.0: the bf16-pairs attention order needs a bfloat16 or "
                            "fp8_e4m3 cache (got float32)",
                            "multiples of 32 up to 512 (got 16 and 16)",
                            "use the float order for this layer, or a bfloat16 or fp8_e4m3 cache"});
  }
  expect_bad_input({"generate", "tiny-swa", "--attention-order", "bf16"},
                   {"--attention-order: bf16 not in {float,bf16-pairs}"});
}

// A drafter proposes 1 to 32 tokens a step in every command that takes one; the serve command
// refuses before it loads the model or listens.
TEST(BadInputCommand, EveryCommandTakesOneToThirtyTwoSpecTokens) {
  for (const char* command : {"generate", "bench-generate", "serve"}) {
    for (const char* k : {"0", "33"}) {
      expect_bad_input({command, "tiny-swa", "--draft", "ngram", "--num-spec-tokens", k},
                       {std::string("--num-spec-tokens ") + k + " is out of range; use 1 to 32"});
    }
  }
}

// Refused before the model loads or a reply starts: the error is all that is printed.
TEST(BadInputCommand, GenerateChecksItsSamplingAndLengthBeforeTheReply) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--max-tokens", "-1"}, "--max-tokens -1 is not positive"},
      {{"--temperature", "-1"}, "temperature = -1 is out of range"},
      {{"--top-p", "2"}, "top_p = 2 is out of range"},
  };
  for (const auto& [flags, needle] : cases) {
    std::vector<std::string> args = {"generate", "tiny-swa"};
    args.insert(args.end(), flags.begin(), flags.end());
    expect_bad_input(args, {needle});
    const testing::CliResult r = testing::run_cli("", args);
    EXPECT_EQ(r.out, "") << flags[0];
  }
}

}  // namespace
}  // namespace mixkv::cli
