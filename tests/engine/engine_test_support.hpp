// Shared by the engine tests: prompt batches and the token streams a plain run gives.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "mixkv/generator.hpp"

namespace mixkv::engine::testing {

// Each request's prompt followed by the tokens the plain run generated for it: what an oracle
// drafter proposes from.
inline std::vector<std::vector<TokenId>> references(
    const std::vector<std::vector<TokenId>>& prompts, const GenerateReport& plain) {
  std::vector<std::vector<TokenId>> out;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    out.push_back(prompts[i]);
    out.back().insert(out.back().end(), plain.requests[i].tokens.begin(),
                      plain.requests[i].tokens.end());
  }
  return out;
}

// 16 byte prompts: the first 100 tokens, the others 1 to 70 (letters in a pattern set by
// `stride_i`, `stride_j`), every odd one starting with the first `shared` bytes of `base`.
inline std::vector<std::vector<TokenId>> mixed_prompts(std::string_view base, std::size_t shared,
                                                       int stride_i, int stride_j) {
  std::vector<std::vector<TokenId>> prompts;
  for (int i = 0; i < 16; ++i) {
    const std::size_t len = i == 0 ? 100 : static_cast<std::size_t>(1 + (i * 37) % 70);
    std::string s;
    for (std::size_t j = 0; j < len; ++j) {
      s.push_back(static_cast<char>(
          'a' +
          (static_cast<std::size_t>(i * stride_i) + j * static_cast<std::size_t>(stride_j)) % 26));
    }
    if (i % 2 == 1) s = std::string(base.substr(0, shared)) + s;
    prompts.push_back(encode_bytes(s));
  }
  return prompts;
}

}  // namespace mixkv::engine::testing
