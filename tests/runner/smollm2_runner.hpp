// SmolLM2-135M-Instruct (the GGUF `make deps` fetches) in the runner, for the tests that compare
// it with llama.cpp's recorded reference and with itself under speculation.
#pragma once

#include <fstream>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "mixkv/runner/model_runner.hpp"
#include "mixkv/weights/gguf.hpp"
#include "mixkv/weights/gguf_model.hpp"
#include "weights/smollm2.hpp"

namespace mixkv::runner::testing {

inline ModelRunner smollm2_runner(const std::string& path, RunnerOptions o = {}) {
  auto file = std::make_shared<const weights::GgufFile>(weights::GgufFile::open(path));
  if (o.max_model_len == 0) o.max_model_len = 1024;
  return ModelRunner(weights::model_source_from_gguf(*file, "smollm2-135m"), file, o);
}

inline nlohmann::json llamacpp_reference() {
  std::ifstream in(MIXKV_SOURCE_DIR "/tests/tokenizer/data/smollm2-llamacpp-reference.json");
  return nlohmann::json::parse(in);
}

// Block ids 1..n for a request of `tokens` tokens, in every KV-cache group (SmolLM2 has one).
inline std::vector<cache::BlockId> first_blocks(std::int64_t tokens, std::int64_t block_size) {
  std::vector<cache::BlockId> out;
  for (std::int64_t b = 0; b * block_size < tokens; ++b) {
    out.emplace_back(static_cast<std::int32_t>(b + 1));
  }
  return out;
}

}  // namespace mixkv::runner::testing
