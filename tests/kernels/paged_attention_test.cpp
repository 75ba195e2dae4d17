// Paged attention against the dense reference on synthetic geometries: page sizes 16/32/64 and a
// 544-token manager block split into 32-token kernel pages, padded and offset pages, every cache
// dtype, GQA/MQA/MHA, windows, soft caps, sinks, causal and non-causal blocks, MLA.
#include "mixkv/kernels/attention_kernel.hpp"

#include <gtest/gtest.h>

#include <random>

#include "kernels/kernels_test_support.hpp"
#include "test_support.hpp"

namespace mixkv::kernels {
namespace {

using testing::Request;

struct PageShape {
  std::int64_t kernel_tokens = 16;
  std::int64_t pages_per_block = 1;
  std::int64_t pad_bytes = 0;  // after each kernel page
  std::int64_t offset = 0;     // of the layer inside a manager page
  bool hnd = false;            // each KV head's tokens side by side (trtllm-gen's layout)
};

// A layer geometry laid out like make_geometry's (NHD or HND, K then V in each kernel page,
// uniform stride) over a tensor of `num_blocks` manager blocks, every byte 0xFF: NaN in every
// dtype, so a read of anything the test did not write shows up as NaN.
struct Synthetic {
  AttentionSpec spec;
  layout::LayerGeometry layer;
  std::vector<std::byte> cache;
  std::int64_t num_blocks = 0;
};

Synthetic make_synthetic(const AttentionSpec& spec, const PageShape& shape,
                         std::int64_t num_blocks) {
  Synthetic s;
  s.spec = spec;
  s.num_blocks = num_blocks;
  auto& l = s.layer;
  l.layer = "synthetic";
  l.offset = shape.offset;
  l.kernel_tokens = shape.kernel_tokens;
  l.kernel_pages_per_block = shape.pages_per_block;
  l.block_tokens = shape.kernel_tokens * shape.pages_per_block;
  const std::int64_t elem = element_bytes(spec.params.kv_dtype);
  l.k_token_bytes = k_row_elements(spec) * elem;
  l.v_token_bytes = v_row_elements(spec) * elem;
  l.kernel_page_bytes = l.kernel_tokens * (l.k_token_bytes + l.v_token_bytes);
  l.v_offset = l.kernel_tokens * l.k_token_bytes;
  l.kernel_page_stride = l.kernel_page_bytes + shape.pad_bytes;
  l.kv_layout = shape.hnd ? attn::KvLayout::kHND : attn::KvLayout::kNHD;
  l.num_kv_heads = spec.mla ? 1 : spec.params.num_kv_heads;
  s.cache.assign(static_cast<std::size_t>(l.offset + num_blocks * l.kernel_pages_per_block *
                                                         l.kernel_page_stride),
                 std::byte{0xFF});
  return s;
}

AttentionSpec make_spec(DType dtype, int q_heads, int kv_heads, int head_size,
                        int head_size_v = 0) {
  AttentionSpec spec;
  spec.params.kv_dtype = dtype;
  spec.params.num_q_heads = q_heads;
  spec.params.num_kv_heads = kv_heads;
  spec.head_size = head_size;
  spec.head_size_v = head_size_v > 0 ? head_size_v : head_size;
  spec.params.scale = 1.0 / std::sqrt(static_cast<double>(head_size));
  return spec;
}

// Requests of the given (kv_len, num_queries) on distinct random blocks (never block 0, the null
// block), written through the slot mapping.
std::vector<Request> make_requests(Synthetic& s, KvScales scales,
                                   const std::vector<std::pair<std::int64_t, std::int64_t>>& shapes,
                                   std::mt19937_64& rng, float magnitude = 1.0f) {
  std::vector<std::int64_t> free(static_cast<std::size_t>(s.num_blocks - 1));
  std::iota(free.begin(), free.end(), 1);
  std::shuffle(free.begin(), free.end(), rng);
  std::vector<Request> out;
  std::size_t next = 0;
  for (auto [kv_len, nq] : shapes) {
    const std::int64_t n = (kv_len + s.layer.block_tokens - 1) / s.layer.block_tokens;
    std::vector<std::int64_t> blocks(free.begin() + static_cast<std::ptrdiff_t>(next),
                                     free.begin() + static_cast<std::ptrdiff_t>(next + n));
    next += static_cast<std::size_t>(n);
    out.push_back(testing::make_request(s.spec, s.layer, scales, s.cache, blocks, kv_len, nq, rng,
                                        magnitude));
  }
  return out;
}

std::int64_t blocks_for(const std::vector<std::pair<std::int64_t, std::int64_t>>& shapes,
                        const PageShape& shape) {
  std::int64_t n = 1;  // the null block
  for (auto [kv_len, nq] : shapes)
    n += (kv_len + shape.kernel_tokens * shape.pages_per_block - 1) /
         (shape.kernel_tokens * shape.pages_per_block);
  return n + 2;
}

std::vector<float> sinks_for(const AttentionSpec& spec, std::mt19937_64& rng) {
  if (!spec.params.sinks) return {};
  return testing::random_values(rng, static_cast<std::size_t>(spec.params.num_q_heads), 3.0f);
}

testing::Comparison run(const AttentionSpec& spec, const PageShape& shape, KvScales scales,
                        const std::vector<std::pair<std::int64_t, std::int64_t>>& shapes,
                        std::mt19937_64& rng, float magnitude = 1.0f) {
  Synthetic s = make_synthetic(spec, shape, blocks_for(shapes, shape));
  const std::vector<Request> requests = make_requests(s, scales, shapes, rng, magnitude);
  const std::vector<float> sinks = sinks_for(spec, rng);
  return testing::run_and_compare(spec, s.layer, scales, s.cache, requests, sinks);
}

const std::vector<PageShape> kPageShapes = {
    {16, 1, 0, 0},         {32, 1, 0, 0}, {64, 1, 0, 0},
    {32, 17, 0, 0},         // a 544-token manager block in 32-token kernel pages (qwen3-next, vLLM)
    {16, 4, 96, 64},        // padded kernel pages, the layer at an offset in its manager page
    {16, 1, 0, 0, true},    // HND
    {32, 4, 96, 64, true},  // HND, padded and offset
};

std::string label(const PageShape& p) {
  return std::to_string(p.kernel_tokens) + "x" + std::to_string(p.pages_per_block) + " pad " +
         std::to_string(p.pad_bytes) + " offset " + std::to_string(p.offset) +
         (p.hnd ? " HND" : " NHD");
}

TEST(PagedDecode, MatchesDenseReferenceAcrossPageSizes) {
  std::mt19937_64 rng(1);
  for (const PageShape& shape : kPageShapes) {
    const AttentionSpec spec = make_spec(DType::kBfloat16, 8, 2, 64);
    std::vector<std::pair<std::int64_t, std::int64_t>> shapes;
    for (int r = 0; r < 3; ++r)
      shapes.emplace_back(std::uniform_int_distribution<std::int64_t>(1, 700)(rng), 1);
    shapes.emplace_back(1, 1);                    // a request of a single token
    shapes.emplace_back(shape.kernel_tokens, 1);  // exactly one full page
    const auto c = run(spec, shape, {}, shapes, rng);
    EXPECT_TRUE(c.ok()) << label(shape) << ": " << c.to_string();
  }
}

TEST(PagedDecode, EveryDtypeWithinItsTolerance) {
  std::mt19937_64 rng(2);
  struct Case {
    DType dtype;
    KvScales scales;
  };
  for (const Case& c : {Case{DType::kFloat32, {}}, Case{DType::kBfloat16, {}},
                        Case{DType::kFloat16, {}}, Case{DType::kFp8E4m3, {0.02f, 0.5f}},
                        Case{DType::kFp8E5m2, {1.0f, 0.001f}}, Case{DType::kFp8E4m3, {}}}) {
    const AttentionSpec spec = make_spec(c.dtype, 8, 4, 64);
    for (const PageShape& shape : {kPageShapes[1], kPageShapes[6]}) {
      const auto r = run(spec, shape, c.scales, {{300, 1}, {45, 1}}, rng, 2.0f);
      EXPECT_TRUE(r.ok()) << to_string(c.dtype) << ", " << label(shape) << ": " << r.to_string();
      // The stored-value check must be tight whatever the dtype; fp32 stores exactly.
      EXPECT_LT(r.tolerance_stored, 1e-4) << to_string(c.dtype);
      if (c.dtype == DType::kFloat32) {
        EXPECT_EQ(r.tolerance_stored, r.tolerance_original);
      }
    }
  }
}

TEST(PagedDecode, GqaMqaMhaAndAnyScale) {
  std::mt19937_64 rng(3);
  struct Heads {
    int q, kv, size;
  };
  for (const Heads& h : {Heads{8, 8, 32}, Heads{8, 1, 64}, Heads{12, 3, 40}, Heads{4, 2, 100}}) {
    for (double scale : {0.05, 0.125, 1.0, -0.3}) {
      AttentionSpec spec = make_spec(DType::kBfloat16, h.q, h.kv, h.size);
      spec.params.scale = scale;
      for (const PageShape& shape : {kPageShapes[0], kPageShapes[5]}) {
        const auto c = run(spec, shape, {}, {{130, 1}, {17, 1}}, rng);
        EXPECT_TRUE(c.ok()) << h.q << "/" << h.kv << " heads of " << h.size << ", scale " << scale
                            << ", " << label(shape) << ": " << c.to_string();
      }
    }
  }
}

TEST(PagedDecode, SoftCapAndSinks) {
  std::mt19937_64 rng(4);
  for (bool sinks : {false, true}) {
    for (std::optional<double> cap :
         {std::optional<double>{}, std::optional<double>{2.0}, std::optional<double>{30.0}}) {
      AttentionSpec spec = make_spec(DType::kBfloat16, 8, 2, 64);
      spec.params.scale = 0.5;  // large logits, so the cap bites
      spec.params.soft_cap = cap;
      spec.params.sinks = sinks;
      const auto c = run(spec, kPageShapes[2], {}, {{200, 1}, {3, 1}}, rng);
      EXPECT_TRUE(c.ok()) << "sinks " << sinks << " cap " << cap.value_or(0) << ": "
                          << c.to_string();
    }
  }
}

// Blocks wholly left of every query's window may already be freed (vLLM hands the null block
// in their place): the kernel must never read them. Block 0 is never written: all NaN.
TEST(PagedDecode, SlidingWindowNeverReadsBlocksOutsideTheWindow) {
  std::mt19937_64 rng(5);
  for (const PageShape& shape : kPageShapes) {
    for (std::int64_t window_left : {0, 1, 15, 127, 500}) {
      AttentionSpec spec = make_spec(DType::kBfloat16, 4, 2, 32);
      spec.params.window_left = window_left;
      const std::vector<std::pair<std::int64_t, std::int64_t>> shapes = {{1100, 1}, {40, 1}};
      Synthetic s = make_synthetic(spec, shape, blocks_for(shapes, shape));
      const std::vector<Request> requests = make_requests(s, {}, shapes, rng);
      std::vector<std::vector<std::int64_t>> tables;
      for (const Request& r : requests) {
        std::vector<std::int64_t> t = r.blocks;
        const std::int64_t lo = std::max<std::int64_t>(0, r.kv_len - 1 - window_left);
        for (std::int64_t b = 0; (b + 1) * s.layer.block_tokens <= lo; ++b)
          t[static_cast<std::size_t>(b)] = 0;
        tables.push_back(std::move(t));
      }
      const auto c =
          testing::run_and_compare(spec, spec, s.layer, {}, s.cache, requests, tables, {});
      EXPECT_TRUE(c.ok()) << label(shape) << " window_left " << window_left << ": "
                          << c.to_string();
    }
  }
}

TEST(PagedPrefill, CausalExtendMatchesReference) {
  std::mt19937_64 rng(6);
  for (const PageShape& shape : kPageShapes) {
    for (std::int64_t window_left : {-1, 20, 100}) {
      AttentionSpec spec = make_spec(DType::kFloat16, 6, 2, 48);
      spec.params.window_left = window_left;
      // Query blocks of 16 are crossed; a whole-prompt prefill (queries == tokens) included.
      const auto c = run(spec, shape, {}, {{300, 37}, {90, 90}, {5, 1}, {64, 16}}, rng);
      EXPECT_TRUE(c.ok()) << label(shape) << " window_left " << window_left << ": "
                          << c.to_string();
    }
  }
}

// A DFlash block: each of its queries sees the whole context and every token of the block.
TEST(PagedPrefill, NonCausalBlockAttendsToWholeContextAndBlock) {
  std::mt19937_64 rng(7);
  for (const PageShape& shape : kPageShapes) {
    for (std::int64_t window_left : {-1, 50}) {
      AttentionSpec spec = make_spec(DType::kBfloat16, 8, 8, 32);
      spec.params.causal = false;
      spec.params.window_left = window_left;
      const auto c = run(spec, shape, {}, {{250, 16}, {16, 16}, {70, 1}}, rng);
      EXPECT_TRUE(c.ok()) << label(shape) << " window_left " << window_left << ": "
                          << c.to_string();
    }
  }
  // The reference really is bidirectional: the block's first query depends on its last key.
  AttentionSpec spec = make_spec(DType::kFloat32, 1, 1, 4);
  spec.params.causal = false;
  std::vector<float> k = {1, 0, 0, 0, 0, 1, 0, 0}, v = {1, 0, 0, 0, 0, 1, 0, 0};
  const std::vector<float> q = {0, 9, 0, 0, 0, 9, 0, 0};
  const auto noncausal = dense_attention(spec, DenseSequence{k, v, q, 2, 2}, {});
  spec.params.causal = true;
  const auto causal = dense_attention(spec, DenseSequence{k, v, q, 2, 2}, {});
  EXPECT_GT(noncausal[1], 0.5);
  EXPECT_EQ(causal[1], 0.0);
}

TEST(PagedAttention, MlaReadsValuesFromTheLatent) {
  std::mt19937_64 rng(8);
  for (const PageShape& shape : {kPageShapes[1], kPageShapes[2], kPageShapes[6]}) {
    for (DType dtype : {DType::kBfloat16, DType::kFp8E4m3}) {
      AttentionSpec spec = make_spec(dtype, 16, 1, 72, 64);  // latent 64 + 8 rope dims
      spec.mla = true;
      const KvScales scales = dtype == DType::kFp8E4m3 ? KvScales{0.01f, 0.01f} : KvScales{};
      const auto c = run(spec, shape, scales, {{200, 1}, {100, 20}}, rng);
      EXPECT_TRUE(c.ok()) << label(shape) << " " << to_string(dtype) << ": " << c.to_string();
    }
  }
}

// Everything at once: random shapes, lengths, windows, page shapes, dtypes, caps, sinks,
// causality and MLA, batched.
TEST(PagedAttention, RandomConfigurationsMatchReference) {
  std::mt19937_64 rng(9);
  const std::vector<DType> dtypes = {DType::kBfloat16, DType::kFloat16, DType::kFloat32,
                                     DType::kFp8E4m3, DType::kFp8E5m2};
  auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
  for (int trial = 0; trial < 40; ++trial) {
    const DType dtype = dtypes[static_cast<std::size_t>(pick(5))];
    const bool mla = pick(5) == 0;
    const int kv = mla ? 1 : 1 << pick(3);
    const int q = kv * (1 << pick(3));
    const int size = 8 * (1 + pick(12));
    AttentionSpec spec = make_spec(dtype, q, kv, size, mla ? size - 8 * pick(size / 8) : size);
    spec.mla = mla;
    spec.params.causal = pick(3) != 0;
    spec.params.window_left = pick(2) ? -1 : pick(200);
    if (pick(3) == 0) spec.params.soft_cap = 1.0 + pick(50);
    spec.params.sinks = pick(3) == 0;
    const PageShape shape =
        kPageShapes[static_cast<std::size_t>(pick(static_cast<int>(kPageShapes.size())))];
    KvScales scales;
    if (dtype == DType::kFp8E4m3 || dtype == DType::kFp8E5m2)
      scales = KvScales{0.005f * static_cast<float>(1 + pick(100)), 0.01f};
    std::vector<std::pair<std::int64_t, std::int64_t>> shapes;
    for (int r = 0, n = 1 + pick(4); r < n; ++r) {
      const std::int64_t len = 1 + pick(400);
      shapes.emplace_back(len, std::min<std::int64_t>(len, pick(2) ? 1 : 1 + pick(40)));
    }
    const auto c = run(spec, shape, scales, shapes, rng);
    EXPECT_TRUE(c.ok()) << "trial " << trial << ": " << to_string(dtype) << " q " << q << " kv "
                        << kv << " size " << size << "/" << spec.head_size_v << " mla " << mla
                        << " causal " << spec.params.causal << " window " << spec.params.window_left
                        << " cap " << spec.params.soft_cap.value_or(0) << " sinks "
                        << spec.params.sinks << " pages " << label(shape) << ": " << c.to_string();
  }
}

TEST(SlotWrite, StoresEachTokenWhereLocateTokenSays) {
  std::mt19937_64 rng(10);
  const AttentionSpec spec = make_spec(DType::kFloat32, 2, 2, 4);
  Synthetic s = make_synthetic(spec, {16, 4, 32, 16}, 6);
  const std::vector<std::int64_t> blocks = {4, 1, 3};
  const Request r = testing::make_request(spec, s.layer, {}, s.cache, blocks, 150, 1, rng);
  for (std::int64_t pos = 0; pos < 150; ++pos) {
    const layout::TokenLocation loc = layout::locate_token(s.layer, blocks, pos);
    std::vector<float> k(8), v(8);
    std::memcpy(k.data(), s.cache.data() + loc.k_offset, 32);
    std::memcpy(v.data(), s.cache.data() + loc.v_offset, 32);
    EXPECT_TRUE(std::equal(k.begin(), k.end(), r.k.begin() + pos * 8)) << pos;
    EXPECT_TRUE(std::equal(v.begin(), v.end(), r.v.begin() + pos * 8)) << pos;
  }
  // Nothing else was written: blocks 0, 2 and 5, and every padding byte, are untouched.
  std::int64_t written = 0;
  for (std::byte b : s.cache) written += b != std::byte{0xFF};
  EXPECT_LE(written, 150 * 64);
}

// HND: a token's head h sits kernel_tokens head pieces after head h - 1, and a head's tokens
// follow each other, at the offsets the geometry's strides give.
TEST(SlotWrite, HndPutsEachHeadsTokensSideBySide) {
  std::mt19937_64 rng(11);
  const AttentionSpec spec = make_spec(DType::kFloat32, 6, 3, 4);
  PageShape shape{16, 2, 32, 16};
  shape.hnd = true;
  Synthetic s = make_synthetic(spec, shape, 5);
  EXPECT_EQ(s.layer.k_head_stride(), 16 * 4 * 4);
  EXPECT_EQ(s.layer.k_row_stride(), 4 * 4);
  const std::vector<std::int64_t> blocks = {3, 1};
  const Request r = testing::make_request(spec, s.layer, {}, s.cache, blocks, 50, 1, rng);
  for (std::int64_t pos = 0; pos < 50; ++pos) {
    const layout::TokenLocation loc = layout::locate_token(s.layer, blocks, pos);
    const std::int64_t page = loc.kernel_page;
    const std::int64_t in_page = pos % 16;
    ASSERT_EQ(loc.k_offset, 16 + page * s.layer.kernel_page_stride + in_page * 16);
    for (int h = 0; h < 3; ++h) {
      std::vector<float> k(4), v(4);
      std::memcpy(k.data(), s.cache.data() + loc.k_offset + h * 16 * 16, 16);
      std::memcpy(v.data(), s.cache.data() + loc.v_offset + h * 16 * 16, 16);
      EXPECT_TRUE(std::equal(k.begin(), k.end(), r.k.begin() + pos * 12 + h * 4))
          << pos << " " << h;
      EXPECT_TRUE(std::equal(v.begin(), v.end(), r.v.begin() + pos * 12 + h * 4))
          << pos << " " << h;
    }
  }
}

TEST(SlotWrite, RejectsSlotsOutsideTheCacheAndWrongShapes) {
  const AttentionSpec spec = make_spec(DType::kBfloat16, 2, 2, 4);
  Synthetic s = make_synthetic(spec, {16, 1, 0, 0}, 2);
  const std::vector<float> k(8), v(8);
  const std::vector<std::int64_t> outside = {32};
  mixkv::testing::expect_error([&] { write_kv(spec, s.layer, {}, s.cache, outside, k, v); },
                               ErrorCode::kInvalidInput, {"outside", "synthetic"});
  const std::vector<std::int64_t> ok = {31};
  const std::vector<float> short_k(7);
  mixkv::testing::expect_error([&] { write_kv(spec, s.layer, {}, s.cache, ok, short_k, v); },
                               ErrorCode::kInvalidInput, {"1 slots need 8 K"});
  mixkv::testing::expect_error(
      [&] {
        write_kv(spec, s.layer, KvScales{2.0f, 1.0f}, s.cache, ok, k, v);
      },
      ErrorCode::kInvalidInput, {"fp8"});
  // An fp8 scale the kernel's exact x 2^8 could overflow.
  const AttentionSpec fp8 = make_spec(DType::kFp8E4m3, 2, 2, 4);
  Synthetic s8 = make_synthetic(fp8, {16, 1, 0, 0}, 2);
  mixkv::testing::expect_error(
      [&] {
        write_kv(fp8, s8.layer, KvScales{1.0f, 0x1p70f}, s8.cache, ok, k, v);
      },
      ErrorCode::kInvalidInput, {"above 2^64"});
}

TEST(PagedAttention, RejectsInputsThatDoNotMatch) {
  const AttentionSpec spec = make_spec(DType::kBfloat16, 4, 2, 8);
  Synthetic s = make_synthetic(spec, {16, 1, 0, 0}, 3);
  const std::vector<std::int64_t> pages = {1, 2};
  const std::vector<float> q(4 * 8);
  std::vector<float> out(4 * 8);
  auto call = [&](const AttentionSpec& sp, std::vector<PagedSequence> batch,
                  std::span<const float> sinks = {}) {
    paged_attention(sp, s.layer, AttentionInputs{s.cache, batch, q, sinks, {}}, out);
  };
  // Geometry made for another dtype.
  AttentionSpec fp8 = spec;
  fp8.params.kv_dtype = DType::kFp8E4m3;
  mixkv::testing::expect_error(
      [&] {
        call(fp8, {{pages, 20, 1}});
      },
      ErrorCode::kInvalidInput, {"synthetic", "bytes per token"});
  // Geometry whose K splits into other heads (its strides would be another layer's): 1 head of 16
  // against 2 of 8, the same bytes a token.
  AttentionSpec one_head = make_spec(DType::kBfloat16, 4, 1, 16);
  mixkv::testing::expect_error(
      [&] {
        call(one_head, {{pages, 20, 1}});
      },
      ErrorCode::kInvalidInput, {"splits a token into 2 KV heads, but the layer has 1"});
  // More tokens than pages.
  mixkv::testing::expect_error(
      [&] {
        call(spec, {{pages, 33, 1}});
      },
      ErrorCode::kInvalidInput, {"33 tokens but 2 kernel pages"});
  // A page past the tensor's end.
  const std::vector<std::int64_t> far = {1, 7};
  mixkv::testing::expect_error(
      [&] {
        call(spec, {{far, 20, 1}});
      },
      ErrorCode::kInvalidInput, {"kernel page 7", "outside"});
  // Sinks the layer does not have.
  const std::vector<float> sinks(4);
  mixkv::testing::expect_error(
      [&] {
        call(spec, {{pages, 20, 1}}, sinks);
      },
      ErrorCode::kInvalidInput, {"sink"});
  AttentionSpec nvfp4 = spec;
  nvfp4.params.kv_dtype = DType::kNvfp4;
  mixkv::testing::expect_error(
      [&] {
        call(nvfp4, {{pages, 20, 1}});
      },
      ErrorCode::kUnsupported, {"nvfp4"});
}

}  // namespace
}  // namespace mixkv::kernels
