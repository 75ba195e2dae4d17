// Flash-decoding (issue 14 §2, §4): long contexts are cut into chunks of kSplitTokens positions
// whose partial softmax states are folded in chunk order, so a pool can spread one request's
// context over its workers. The chunks are fixed by positions alone; these tests pin that every
// output is bit for bit the same with 1, 2, 3 or 7 workers (whole context in one task, or chunk
// pieces on several), for each row of a verify against its own decode, for a request alone and
// inside a batch, and for a prefill in one call against the same rows in chunked-prefill calls,
// under every instruction set the binary carries, and that the result still matches the dense
// double reference.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention_simd.hpp"
#include "kernels/kernels_test_support.hpp"
#include "mixkv/kernels/attention_kernel.hpp"
#include "mixkv/kernels/simd_targets.hpp"
#include "mixkv/kernels/thread_pool.hpp"

namespace mixkv::kernels {
// A named namespace (not only an anonymous one): in a unity batch its Case and Layer meet
// other test files' helpers of the same names.
namespace flash_decode_test {
namespace {

using detail::kSplitTokens;

struct Case {
  std::string name;
  AttentionSpec spec;
  std::int64_t page_tokens;
};

// Small heads (the tests run under the sanitizers) over contexts of 2-3 chunks. 40-token pages do
// not divide the chunk, so a tile is cut at a chunk boundary inside a page.
std::vector<Case> cases() {
  AttentionSpec gqa;
  gqa.params.kv_dtype = DType::kBfloat16;
  gqa.params.num_q_heads = 8;
  gqa.params.num_kv_heads = 2;
  gqa.head_size = 64;
  gqa.head_size_v = 64;
  gqa.params.scale = 0.125;
  gqa.params.soft_cap = 30.0;
  gqa.params.sinks = true;
  AttentionSpec window = gqa;
  window.params.window_left = 1300;  // the first chunk is left of every query's window
  window.params.soft_cap.reset();
  AttentionSpec mqa = gqa;  // one KV head: only the context split keeps two workers busy
  mqa.params.kv_dtype = DType::kFp8E4m3;
  mqa.params.num_kv_heads = 1;
  mqa.params.sinks = false;
  mqa.params.soft_cap.reset();
  AttentionSpec mla;
  mla.params.kv_dtype = DType::kFloat16;
  mla.params.num_q_heads = 4;
  mla.params.num_kv_heads = 1;
  mla.head_size = 72;  // the scratch path (not a multiple of the vector)
  mla.head_size_v = 40;
  mla.mla = true;
  mla.params.scale = 0.1;
  AttentionSpec block = gqa;  // a DFlash block: non-causal
  block.params.causal = false;
  block.params.soft_cap.reset();
  return {{"bf16 gqa cap sinks", gqa, 16},
          {"bf16 gqa window, 40-token pages", window, 40},
          {"fp8 mqa", mqa, 16},
          {"fp16 mla head 72", mla, 32},
          {"bf16 non-causal block", block, 16}};
}

using testing::Layer;
using testing::same_bits;

Layer make_layer(const Case& c, std::int64_t num_pages) {
  return testing::make_layer(c.spec, num_pages, c.page_tokens, "flash");
}

// Attention of queries `q` (rows of num_q_heads * head_size) as one request with `kv_len`
// tokens and the last `rows` of them as queries (plus `others` in the same batch, first).
std::vector<float> attend(const Layer& l, const std::vector<std::int64_t>& pages,
                          std::int64_t kv_len, std::int64_t rows, std::span<const float> q,
                          std::span<const float> sinks, ThreadPool* pool,
                          const std::vector<PagedSequence>& others = {},
                          std::span<const float> others_q = {}) {
  std::vector<PagedSequence> batch = others;
  batch.push_back({pages, kv_len, rows});
  std::vector<float> queries(others_q.begin(), others_q.end());
  queries.insert(queries.end(), q.begin(), q.end());
  const auto per_row = static_cast<std::size_t>(l.spec.params.num_q_heads * l.spec.head_size);
  const auto out_row = static_cast<std::size_t>(l.spec.params.num_q_heads * l.spec.head_size_v);
  std::vector<float> out(queries.size() / per_row * out_row);
  AttentionInputs inputs{l.cache, batch, queries, sinks, {}};
  inputs.pool = pool;
  paged_attention(l.spec, l.geometry, inputs, out);
  return {out.end() - static_cast<std::ptrdiff_t>(static_cast<std::size_t>(rows) * out_row),
          out.end()};
}

constexpr std::int64_t kContext = 2 * kSplitTokens + 300;  // three chunks
constexpr std::int64_t kRows = 5;

// `full`: every pool, the batch and the chunked prefill; else (the other instruction sets, kept
// short for the sanitizer build) the verify on 2 workers and each row's decode on one.
void check_case(const Case& c, const std::string& target, bool full) {
  const std::string where = c.name + " on " + target;
  std::mt19937_64 rng(31);
  const std::int64_t pages = (kContext + c.page_tokens - 1) / c.page_tokens;
  Layer l = make_layer(c, pages + 4);
  std::vector<std::int64_t> blocks(static_cast<std::size_t>(pages));
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  const auto r =
      testing::make_request(l.spec, l.geometry, {}, l.cache, blocks, kContext, kRows, rng);
  const auto other = testing::make_request(l.spec, l.geometry, {}, l.cache,
                                           {pages, pages + 1, pages + 2, pages + 3}, 50, 2, rng);
  const std::vector<float> sinks =
      c.spec.params.sinks
          ? testing::random_values(rng, static_cast<std::size_t>(c.spec.params.num_q_heads), 1.0f)
          : std::vector<float>{};
  const auto q_row = static_cast<std::size_t>(c.spec.params.num_q_heads * c.spec.head_size);
  const auto o_row = static_cast<std::size_t>(c.spec.params.num_q_heads * c.spec.head_size_v);

  // Accuracy of the verify block (and so of the fold) against the dense double reference.
  const testing::Comparison cmp =
      testing::run_and_compare(l.spec, l.geometry, {}, l.cache, {r}, sinks);
  EXPECT_TRUE(cmp.ok()) << where << ": " << cmp.to_string();

  ThreadPool two(2), three(3), seven(7);
  const std::vector<ThreadPool*> pools =
      full ? std::vector<ThreadPool*>{nullptr, &two, &three, &seven}
           : std::vector<ThreadPool*>{&two};
  const auto verify = attend(l, blocks, kContext, kRows, r.q, sinks, nullptr);
  for (float x : verify) ASSERT_TRUE(std::isfinite(x)) << where;
  for (ThreadPool* pool : pools) {
    const std::string how = where + (pool ? ", " + std::to_string(pool->size()) + " workers" : "");
    // The verify block: the same bits on any pool, and inside a batch.
    EXPECT_TRUE(same_bits(attend(l, blocks, kContext, kRows, r.q, sinks, pool), verify)) << how;
    const std::vector<PagedSequence> others = {{other.blocks, other.kv_len, other.num_queries}};
    if (full) {
      EXPECT_TRUE(
          same_bits(attend(l, blocks, kContext, kRows, r.q, sinks, pool, others, other.q), verify))
          << how << ", in a batch";
    }
    // Each row: its own decode (causal: a context ending at its position; non-causal: the same
    // context as a lone query).
    for (std::int64_t i = 0; i < kRows; ++i) {
      const std::int64_t kv = c.spec.params.causal ? kContext - kRows + i + 1 : kContext;
      const std::span<const float> qi(r.q.data() + static_cast<std::size_t>(i) * q_row, q_row);
      const std::span<const float> mine(verify.data() + static_cast<std::size_t>(i) * o_row, o_row);
      EXPECT_TRUE(same_bits(attend(l, blocks, kv, 1, qi, sinks, full ? pool : nullptr), mine))
          << how << ": row " << i << " against its decode";
    }
  }
  // A chunked prefill: the last 40 positions in one call, and in calls of 16, 16 and 8 rows
  // (causal only: a non-causal block is one call by definition), on a pool.
  if (full && c.spec.params.causal) {
    const std::int64_t rows = 40;
    const std::vector<float> q =
        testing::random_values(rng, static_cast<std::size_t>(rows) * q_row, 1.0f);
    const auto whole = attend(l, blocks, kContext, rows, q, sinks, &two);
    std::vector<float> pieces;
    for (std::int64_t first = 0; first < rows;) {
      const std::int64_t n = std::min<std::int64_t>(first < 32 ? 16 : 8, rows - first);
      const std::span<const float> qn(q.data() + static_cast<std::size_t>(first) * q_row,
                                      static_cast<std::size_t>(n) * q_row);
      const auto part = attend(l, blocks, kContext - rows + first + n, n, qn, sinks,
                               first == 16 ? nullptr : &seven);
      pieces.insert(pieces.end(), part.begin(), part.end());
      first += n;
    }
    EXPECT_TRUE(same_bits(whole, pieces)) << where << ": chunked prefill";
  }
}

TEST(FlashDecoding, ChunksAreBitIdenticalForThreadsRowsBatchesAndPrefillChunks) {
  int targets = 0;
  for_each_simd_target([&](const std::string& target) {
    for (const Case& c : cases()) check_case(c, target, targets == 0);  // the best one in full
    ++targets;
  });
  EXPECT_GE(targets, 1);
  // Where the CPU has AMX, the bf16 cases on 16-token pages took the tile path above: check the
  // float path for them too.
  set_attention_amx(false);
  for (const Case& c : cases()) {
    if (c.spec.params.kv_dtype == DType::kBfloat16) check_case(c, "the float path", false);
  }
  set_attention_amx(true);
}

// The fold is exact where it must be: a context of exactly one chunk, with nothing to fold, gives
// the same bits as one chunk boundary later (a query that sees no key of the second chunk).
TEST(FlashDecoding, AChunkAQuerySeesNothingOfChangesNothing) {
  Case c = cases()[0];
  c.spec.params.window_left = 100;
  std::mt19937_64 rng(5);
  const std::int64_t kv = kSplitTokens + 64;
  const std::int64_t pages = kv / c.page_tokens;
  Layer l = make_layer(c, pages);
  std::vector<std::int64_t> blocks(static_cast<std::size_t>(pages));
  std::iota(blocks.begin(), blocks.end(), 0);
  const auto r = testing::make_request(l.spec, l.geometry, {}, l.cache, blocks, kv, 1, rng);
  const std::vector<float> sinks(8, 0.5f);
  ThreadPool two(2);
  // Position kSplitTokens - 1 alone (one chunk) and as the first row of a 65-row block whose
  // later rows reach into the second chunk.
  const auto alone = attend(l, blocks, kSplitTokens, 1, std::span<const float>(r.q), sinks, &two);
  std::vector<float> q = testing::random_values(rng, 65 * 8 * 64, 1.0f);
  std::copy(r.q.begin(), r.q.end(), q.begin());
  const auto block = attend(l, blocks, kv, 65, q, sinks, &two);
  EXPECT_TRUE(same_bits(alone, std::span<const float>(block).first(alone.size())));
}

}  // namespace
}  // namespace flash_decode_test
}  // namespace mixkv::kernels
