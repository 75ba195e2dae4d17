// Shared by the engine tests: prompt batches and the token streams a plain run gives.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mixkv/engine/generator.hpp"

namespace mixkv::engine::testing {

// Tokens each request generates in the tests that compare speculative with plain decoding: 256
// in the Release build (`make test`, the acceptance), 64 under the sanitizers (`make
// test-sanitize`), which run the same code paths for memory errors at about ten times the cost
// per token.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr std::int64_t kGeneratedTokens = 64;
#else
inline constexpr std::int64_t kGeneratedTokens = 256;
#endif

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

// A tiny model with its generated weights.
inline ModelRunner tiny_runner(std::string_view name, const RunnerOptions& o = {}) {
  const TinyModel& m = *find_tiny_model(name);
  const model::ModelSource src = tiny_model_source(m);
  const auto desc = model::describe(src, std::nullopt, {});
  return ModelRunner(src, generate_weights(read_transformer_config(src), desc, m.seed), o);
}

inline void expect_same_tokens(const GenerateReport& a, const GenerateReport& b,
                               const std::string& what) {
  ASSERT_EQ(a.requests.size(), b.requests.size()) << what;
  for (std::size_t i = 0; i < a.requests.size(); ++i) {
    EXPECT_EQ(a.requests[i].tokens, b.requests[i].tokens) << what << ", request " << i;
  }
}

// The tiny model `target` with a drafter model planned into the same cache (o.draft =
// `draft`), and both models' weights (the drafter's generated with `draft_seed`).
inline ModelRunner runner_with_drafter(std::string_view target, const model::ModelSource& draft,
                                       std::uint64_t draft_seed, RunnerOptions o) {
  const TinyModel& m = *find_tiny_model(target);
  const model::ModelSource src = tiny_model_source(m);
  o.draft = draft;
  model::DescribeOptions d;
  d.num_spec_tokens = o.num_spec_tokens;
  const auto desc = model::describe(src, o.draft, d);
  weights::TensorMap w = generate_weights(read_transformer_config(src), desc, m.seed);
  w.merge(generate_draft_weights(read_transformer_config(draft), desc, draft_seed));
  return ModelRunner(src, w, o);
}

// Each request of `shorter` generated the first tokens of `longer`'s request (greedy decoding:
// a shorter run is a prefix of a longer one). Returns the prefix-hit tokens `shorter` took.
inline std::int64_t expect_prefix_of(const GenerateReport& longer, const GenerateReport& shorter,
                                     const std::string& what) {
  std::int64_t hit_tokens = 0;
  EXPECT_EQ(longer.requests.size(), shorter.requests.size()) << what;
  for (std::size_t i = 0; i < std::min(longer.requests.size(), shorter.requests.size()); ++i) {
    const std::vector<TokenId>& got = shorter.requests[i].tokens;
    const std::vector<TokenId>& all = longer.requests[i].tokens;
    EXPECT_LE(got.size(), all.size()) << what << ", request " << i;
    EXPECT_TRUE(
        std::equal(got.begin(), got.end(), all.begin(),
                   all.begin() + static_cast<std::ptrdiff_t>(std::min(got.size(), all.size()))))
        << what << ", request " << i;
    hit_tokens += shorter.requests[i].stats.prefix_hit_tokens;
  }
  return hit_tokens;
}

// A request's cache as the kernels see it: the live state bytes of every recurrent layer, and
// the K/V bytes of every verified position each attention layer still holds (sliding layers
// drop what left the window), keyed by layer and position (block ids differ between runs).
struct CacheImage {
  std::map<std::string, std::vector<std::byte>> states;
  std::map<std::pair<std::string, std::int64_t>, std::vector<std::byte>> pages;
  bool operator==(const CacheImage&) const = default;
};

// Only the layers `keep` accepts (by name: "layers.3", "draft.layers.0").
inline CacheImage cache_image(const ModelRunner& runner, const cache::KvCacheManager& m,
                              cache::RequestId id,
                              const std::function<bool(const std::string&)>& keep) {
  CacheImage image;
  for (const layout::LayerGeometry& g : runner.geometry().layers) {
    if (!keep(g.layer)) continue;
    const auto table = m.block_table(id, g.kv_cache_group);
    const auto tensor = runner.cache_tensor(g.tensor);
    if (g.recurrent) {
      const auto at = static_cast<std::size_t>(g.offset + table[0].value() * g.kernel_page_stride);
      image.states[g.layer].assign(
          tensor.begin() + static_cast<std::ptrdiff_t>(at),
          tensor.begin() + static_cast<std::ptrdiff_t>(at) + g.state_bytes);
      continue;
    }
    std::vector<std::int64_t> blocks;
    for (cache::BlockId b : table) blocks.push_back(b.value());
    for (std::int64_t p = 0; p < m.num_computed(id); ++p) {
      if (table[static_cast<std::size_t>(p / g.block_tokens)].is_null()) continue;
      const layout::TokenLocation at = layout::locate_token(g, blocks, p);
      std::vector<std::byte> bytes(tensor.begin() + at.k_offset,
                                   tensor.begin() + at.k_offset + g.k_token_bytes);
      bytes.insert(bytes.end(), tensor.begin() + at.v_offset,
                   tensor.begin() + at.v_offset + g.v_token_bytes);
      image.pages[{g.layer, p}] = std::move(bytes);
    }
  }
  return image;
}

// `got` holds `want`'s bytes: the live state of each of `recurrent_layers` recurrent layers, and
// every page.
inline void expect_same_cache(const CacheImage& want, const CacheImage& got,
                              std::size_t recurrent_layers, const std::string& what) {
  ASSERT_EQ(want.states.size(), recurrent_layers) << what;
  ASSERT_EQ(want.states.size(), got.states.size()) << what;
  for (const auto& [name, bytes] : want.states) {
    EXPECT_EQ(bytes, got.states.at(name)) << what << ": state of " << name;
  }
  ASSERT_FALSE(want.pages.empty()) << what;
  EXPECT_EQ(want.pages.size(), got.pages.size()) << what;
  for (const auto& [key, bytes] : want.pages) {
    const auto it = got.pages.find(key);
    ASSERT_NE(it, got.pages.end()) << what << ": " << key.first << " position " << key.second;
    EXPECT_EQ(it->second, bytes) << what << ": " << key.first << " position " << key.second;
  }
}

}  // namespace mixkv::engine::testing
