// Paged attention speed, each figure next to its ceiling measured in the same run:
//  - decode over paged vs contiguous K/V (same kernel, same bytes: contiguous is one kernel page
//    holding the whole context), bf16 and fp8, at 1k-32k tokens, on 1 thread and on all, with
//    bytes/s; beside it the streaming-read bandwidth on the same thread counts;
//  - causal prefill FLOP/s beside an f32 matrix multiply (bench_matmul.cpp, Highway) on the same
//    threads.
// Issue 5 aims at paged within 10% of contiguous, decode >= 70% of streaming at 8k+ with bf16.
//  - multi-row decode (a speculative verify: k + 1 causal rows of one request) at 8k and 32k;
//  - weight-streaming matrix products Y = X W^T (kernels/matmul.hpp) of 1-64 token rows against a
//    4096 x 14336 weight (Llama-3-8B's down projection) in each storage type, with bytes/s in
//    unique bytes of W per call, beside the streaming read.
// Issue 14 aims at: decode >= 70% of streaming; weight matmul 1 row >= 80% of streaming, 8 rows
// <= 1.3x the time of 1 row.
// Names: BM_Decode/<paged|contiguous>/<dtype>/ctx:<tokens>/threads:<n>, BM_StreamRead/threads:<n>,
// BM_ComputePeak/<vnni_int8|bf16_dot|fma_f32>/threads:<n> (multiply-adds per second: the compute
// yardstick), BM_Prefill/<dtype>/tokens:<n>/threads:<n>, BM_Matmul/n:<n>/threads:<n>,
// BM_DecodeMultiRow/<dtype>/rows:<r>/ctx:<tokens>/threads:<n> (and BM_Decode/paged/<dtype>_pairs,
// BM_DecodeMultiRow/<dtype>_pairs for bfloat16 and fp8_e4m3: the same caches in
// AttentionOrder::kBf16Pairs; BM_Decode/paged_hnd/<dtype>[_pairs]/ctx:<tokens>: HND pages),
// BM_DecodeBatch/<dtype>/requests:<n>/ctx:<tokens>/threads:<n> (short contexts, many requests),
// BM_WeightMatmul/<dtype>/rows:<r>/threads:<n>, and BM_WeightMatmul/<dtype>_blocksum/... for
// bfloat16 and the block formats in the kBlockSum order (also over SmolLM2's 1536 x 576 up
// projection:
// BM_WeightMatmul/<dtype>_blocksum/1536x576/rows:<r>/threads:<n>), BM_SiluMul/smollm2/rows:<r>/
// threads:1 (the MLP's activation over r rows of 1536).
#include <benchmark/benchmark.h>
#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "bench_matmul.hpp"
#include "mixkv/kernels/activation.hpp"
#include "mixkv/kernels/attention_kernel.hpp"
#include "mixkv/kernels/convert.hpp"
#include "mixkv/kernels/matmul.hpp"
#include "mixkv/kernels/thread_pool.hpp"

namespace {

using namespace mixkv;
using namespace mixkv::kernels;

// The attention layer a benchmark runs: query heads, KV heads, head size.
struct LayerShape {
  int q_heads, kv_heads, head;
  auto operator<=>(const LayerShape&) const = default;
};
// One Llama-style layer: 32 query heads, 8 KV heads of 128.
constexpr LayerShape kLlama{32, 8, 128};
// SmolLM2-135M's layer: 9 query heads, 3 KV heads of 64 (its GGUF's attention.head_count and
// head_count_kv), whose short verify contexts issue 15's speculation lives on.
constexpr LayerShape kSmolLm2{9, 3, 64};
constexpr int kQHeads = kLlama.q_heads;
constexpr int kHead = kLlama.head;
constexpr std::int64_t kPageTokens = 16;

AttentionSpec bench_spec(DType dtype, const LayerShape& shape = kLlama) {
  AttentionSpec spec;
  spec.params.kv_dtype = dtype;
  spec.params.num_q_heads = shape.q_heads;
  spec.params.num_kv_heads = shape.kv_heads;
  spec.params.scale = 1.0 / std::sqrt(static_cast<double>(shape.head));
  spec.params.causal = true;
  spec.head_size = shape.head;
  spec.head_size_v = shape.head;
  return spec;
}

// The pool of `threads` workers (nullptr for 1: the calling thread, no pool), made once.
ThreadPool* pool_of(int threads) {
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  if (threads <= 1) return nullptr;
  auto& p = pools[threads];
  if (!p) p = std::make_unique<ThreadPool>(threads);
  return p.get();
}

// Bytes the memory-bound benchmarks spread their data over: well beyond the last-level cache
// (the development VM reports a 480 MiB L3), so every figure is a DRAM figure.
constexpr std::int64_t kBeyondCaches = std::int64_t{1} << 30;

// A cache of `context` tokens in kernel pages of `page_tokens` (shuffled page order when paged);
// random values in [-2, 2) written through write_kv, so every dtype holds realistic codes. The
// cache is held in copies filling at least kBeyondCaches and calls cycle through them, so K and
// V come from memory every call, as a model's layers do (a 32k bf16 cache of this shape is
// 134 MB, which a large L3 would otherwise hold, and the figures would be L3's, not streaming's).
struct CacheFixture {
  LayerShape shape;
  AttentionSpec spec;
  layout::LayerGeometry layer;
  std::vector<std::byte> cache;  // copies x copy_bytes
  std::int64_t copy_bytes = 0, copies = 0;
  std::vector<std::int64_t> pages;
  // The copy the i-th call reads.
  std::span<const std::byte> copy(std::int64_t i) const {
    return std::span<const std::byte>(cache).subspan(
        static_cast<std::size_t>((i % copies) * copy_bytes), static_cast<std::size_t>(copy_bytes));
  }
};

// `layers` copies when positive (a model's layers, which its step reads one after the other, so the
// caches hold what they would in a real step), else as many as fill kBeyondCaches.
CacheFixture make_cache(DType dtype, std::int64_t context, bool paged,
                        const LayerShape& shape = kLlama, std::int64_t layers = 0,
                        attn::KvLayout kv_layout = attn::KvLayout::kNHD) {
  CacheFixture f;
  f.shape = shape;
  f.spec = bench_spec(dtype, shape);
  const std::int64_t page_tokens = paged ? kPageTokens : context;
  auto& l = f.layer;
  l.layer = paged ? "paged" : "contiguous";
  l.kernel_tokens = page_tokens;
  l.block_tokens = page_tokens;
  l.k_token_bytes = k_row_elements(f.spec) * element_bytes(dtype);
  l.v_token_bytes = l.k_token_bytes;
  l.kernel_page_bytes = page_tokens * (l.k_token_bytes + l.v_token_bytes);
  l.kernel_page_stride = l.kernel_page_bytes;
  l.v_offset = page_tokens * l.k_token_bytes;
  l.kv_layout = kv_layout;
  l.num_kv_heads = shape.kv_heads;
  const std::int64_t num_pages = context / page_tokens;
  f.cache.resize(static_cast<std::size_t>(num_pages * l.kernel_page_stride));
  f.pages.resize(static_cast<std::size_t>(num_pages));
  std::iota(f.pages.begin(), f.pages.end(), 0);
  if (paged) std::shuffle(f.pages.begin(), f.pages.end(), std::mt19937_64(1));
  // Written in chunks of one page: the same values whatever the layout.
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  const auto row = static_cast<std::size_t>(k_row_elements(f.spec));
  std::vector<float> k(row * kPageTokens), v(row * kPageTokens);
  for (std::int64_t t0 = 0; t0 < context; t0 += kPageTokens) {
    for (auto& x : k) x = dist(rng);
    for (auto& x : v) x = dist(rng);
    std::vector<std::int64_t> slots;
    for (std::int64_t t = t0; t < t0 + kPageTokens; ++t)
      slots.push_back(f.pages[static_cast<std::size_t>(t / page_tokens)] * page_tokens +
                      t % page_tokens);
    write_kv(f.spec, l, {}, f.cache, slots, k, v);
  }
  f.copy_bytes = static_cast<std::int64_t>(f.cache.size());
  f.copies = layers > 0
                 ? layers
                 : std::max<std::int64_t>(2, (kBeyondCaches + f.copy_bytes - 1) / f.copy_bytes);
  f.cache.resize(static_cast<std::size_t>(f.copies * f.copy_bytes));
  for (std::int64_t c = 1; c < f.copies; ++c) {
    std::memcpy(f.cache.data() + c * f.copy_bytes, f.cache.data(),
                static_cast<std::size_t>(f.copy_bytes));
  }
  return f;
}

// One fixture at a time (each holds kBeyondCaches or more, or a model's layers).
const CacheFixture& cache_of(DType dtype, std::int64_t context, bool paged,
                             const LayerShape& shape = kLlama, std::int64_t layers = 0,
                             attn::KvLayout kv_layout = attn::KvLayout::kNHD) {
  static std::tuple<DType, std::int64_t, bool, LayerShape, std::int64_t, attn::KvLayout> key;
  static std::unique_ptr<CacheFixture> f;
  if (f && key == std::tuple{dtype, context, paged, shape, layers, kv_layout}) return *f;
  f.reset();
  f = std::make_unique<CacheFixture>(make_cache(dtype, context, paged, shape, layers, kv_layout));
  key = {dtype, context, paged, shape, layers, kv_layout};
  return *f;
}

std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> out(n);
  for (auto& x : out) x = dist(rng);
  return out;
}

// Times paged_attention over `batch` with random query rows (seeded by `seed`), each call on the
// next copy of the fixture's cache; the label is the dispatched target.
void time_attention(benchmark::State& state, const CacheFixture& f,
                    std::span<const PagedSequence> batch, std::uint64_t seed, int threads,
                    AttentionOrder order = AttentionOrder::kFloat) {
  AttentionSpec spec = f.spec;
  spec.order = order;
  std::int64_t rows = 0;
  for (const PagedSequence& seq : batch) rows += seq.num_queries;
  const std::vector<float> queries =
      random_floats(static_cast<std::size_t>(rows * f.shape.q_heads * f.shape.head), seed);
  std::vector<float> out(queries.size());
  AttentionInputs inputs{f.copy(0), batch, queries, {}, {}};
  inputs.pool = pool_of(threads);
  std::int64_t call = 0;
  for (auto _ : state) {
    inputs.cache = f.copy(call++);
    paged_attention(spec, f.layer, inputs, out);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetLabel(simd_target() + (order == AttentionOrder::kBf16Pairs && attention_uses_bf16_dots()
                                      ? " vdpbf16ps"
                                      : ""));
}

// K and V bytes of `tokens` cached tokens of the benchmark layer.
std::int64_t kv_bytes(DType dtype, std::int64_t tokens, const LayerShape& shape = kLlama) {
  return tokens * 2 * shape.kv_heads * shape.head * element_bytes(dtype);
}

// One decode query over the whole context. Bytes/s counts the K and V bytes read per call.
void run_decode(benchmark::State& state, DType dtype, std::int64_t context, bool paged, int threads,
                AttentionOrder order = AttentionOrder::kFloat,
                attn::KvLayout kv_layout = attn::KvLayout::kNHD) {
  const CacheFixture& f = cache_of(dtype, context, paged, kLlama, 0, kv_layout);
  const std::vector<PagedSequence> batch = {{f.pages, context, 1}};
  time_attention(state, f, batch, 2, threads, order);
  state.SetBytesProcessed(state.iterations() * kv_bytes(dtype, context));
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * context), benchmark::Counter::kIsRate);
}

// A decode batch: `requests` requests of `context` tokens each, one query row apiece, in one
// call (a serving step's attention). Each request owns its share of the fixture's shuffled pages,
// so at short contexts a task is a few pages long and its first tile's latency is not hidden
// behind a long stream. Bytes/s counts every request's K and V once per call.
void run_decode_batch(benchmark::State& state, DType dtype, std::int64_t requests,
                      std::int64_t context, int threads) {
  const CacheFixture& f = cache_of(dtype, requests * context, true);
  const auto pages = static_cast<std::size_t>(context / kPageTokens);
  std::vector<PagedSequence> batch;
  for (std::size_t r = 0; r < static_cast<std::size_t>(requests); ++r)
    batch.push_back({std::span<const std::int64_t>(f.pages).subspan(r * pages, pages), context, 1});
  time_attention(state, f, batch, 2, threads);
  state.SetBytesProcessed(state.iterations() * kv_bytes(dtype, requests * context));
}

// A speculative verify: the last `rows` positions of one request of `context` tokens (causal
// among themselves) in one call, each K/V tile read once for all rows. Bytes/s counts the K and V
// bytes of the context once per call, as decode does, so 1 row here is BM_Decode/paged.
void run_multi_row(benchmark::State& state, DType dtype, std::int64_t rows, std::int64_t context,
                   int threads, AttentionOrder order = AttentionOrder::kFloat) {
  const CacheFixture& f = cache_of(dtype, context, true);
  const std::vector<PagedSequence> batch = {{f.pages, context, rows}};
  time_attention(state, f, batch, 2, threads, order);
  state.SetBytesProcessed(state.iterations() * kv_bytes(dtype, context));
}

// SmolLM2-135M's verify: the last `rows` positions of one request of `context` tokens over one of
// its layers (fp16, as the engine caches it), the layers' caches read in turn as a step reads
// them. Its contexts are short, so the figure is the kernel's arithmetic, not memory's.
void run_multi_row_smollm2(benchmark::State& state, std::int64_t rows, std::int64_t context,
                           int threads) {
  constexpr std::int64_t kLayers = 30;  // SmolLM2-135M's block_count
  const CacheFixture& f = cache_of(DType::kFloat16, context, true, kSmolLm2, kLayers);
  const std::vector<PagedSequence> batch = {{f.pages, context, rows}};
  time_attention(state, f, batch, 2, threads);
  state.SetBytesProcessed(state.iterations() * kv_bytes(DType::kFloat16, context, kSmolLm2));
}

// Causal prefill of `tokens` queries over themselves (kv_len == tokens). FLOPs: for each query
// and head, 2*d for q.k and 2*dv for the weighted V sum per visible key.
void run_prefill(benchmark::State& state, DType dtype, std::int64_t tokens, int threads) {
  const CacheFixture& f = cache_of(dtype, tokens, true);
  const std::vector<PagedSequence> batch = {{f.pages, tokens, tokens}};
  time_attention(state, f, batch, 4, threads);
  const double visible = static_cast<double>(tokens) * static_cast<double>(tokens + 1) / 2;
  const double flops = visible * kQHeads * 2.0 * (kHead + kHead);
  state.counters["flop_per_s"] = benchmark::Counter(flops * static_cast<double>(state.iterations()),
                                                    benchmark::Counter::kIsRate);
}

// f32 matmul of n x n by n x n, 2 n^3 FLOPs.
void run_matmul(benchmark::State& state, std::int64_t n, int threads) {
  const auto a = random_floats(static_cast<std::size_t>(n * n), 5);
  const auto b = random_floats(static_cast<std::size_t>(n * n), 6);
  std::vector<float> c(static_cast<std::size_t>(n * n));
  // One element checked against a plain dot product, so a broken yardstick cannot pass silently.
  bench::matmul(a.data(), b.data(), c.data(), n, n, n, pool_of(threads));
  double expect = 0;
  for (std::int64_t p = 0; p < n; ++p)
    expect +=
        double{a[static_cast<std::size_t>(3 * n + p)]} * b[static_cast<std::size_t>(p * n + n - 1)];
  if (std::abs(expect - c[static_cast<std::size_t>(3 * n + n - 1)]) > 1e-3) {
    state.SkipWithError("matmul gives a wrong result");
    return;
  }
  for (auto _ : state) {
    bench::matmul(a.data(), b.data(), c.data(), n, n, n, pool_of(threads));
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.counters["flop_per_s"] = benchmark::Counter(
      2.0 * static_cast<double>(n * n * n) * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
}

// Copies of one random [rows, cols] weight filling at least kBeyondCaches; calls cycle through
// them, so W comes from memory every time, as a model's layers do. One type at a time is kept.
struct WeightFixture {
  WeightType type;
  std::int64_t rows, cols, bytes;
  std::vector<std::byte> data;  // copies x bytes
  std::int64_t copies;
};

const WeightFixture& weight_of(WeightType type, std::int64_t rows, std::int64_t cols) {
  static std::unique_ptr<WeightFixture> f;
  if (f && f->type == type && f->rows == rows && f->cols == cols) return *f;
  f.reset();
  f = std::make_unique<WeightFixture>();
  f->type = type;
  f->rows = rows;
  f->cols = cols;
  f->bytes = weight_bytes(type, rows, cols);
  f->copies = std::max<std::int64_t>(2, (kBeyondCaches + f->bytes - 1) / f->bytes);
  f->data.resize(static_cast<std::size_t>(f->bytes * f->copies));
  // One copy of random codes: float types from values in [-1, 1), block types random bytes with
  // each block's fp16 scale (and q4_1 minimum) set to a finite value.
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::byte* w = f->data.data();
  const std::int64_t block = weight_block_elements(type);
  const std::int64_t block_bytes = weight_bytes(type, 1, block);
  const auto put16 = [](std::byte* p, std::uint16_t v) { std::memcpy(p, &v, 2); };
  for (std::int64_t b = 0; b < f->bytes / block_bytes; ++b) {
    std::byte* p = w + b * block_bytes;
    switch (type) {
      case WeightType::kFloat32: {
        const float v = dist(rng);
        std::memcpy(p, &v, 4);
        break;
      }
      case WeightType::kBfloat16:
        put16(p, float_to_bf16(dist(rng)));
        break;
      case WeightType::kFloat16:
        put16(p, float_to_fp16(dist(rng)));
        break;
      default:
        for (std::int64_t i = 0; i < block_bytes; i += 8) {
          const std::uint64_t r = rng();
          std::memcpy(p + i, &r,
                      static_cast<std::size_t>(std::min<std::int64_t>(8, block_bytes - i)));
        }
        put16(p, float_to_fp16(dist(rng) * 0.01f));
        if (type == WeightType::kQ4_1) put16(p + 2, float_to_fp16(dist(rng) * 0.01f));
        break;
    }
  }
  for (std::int64_t c = 1; c < f->copies; ++c)
    std::memcpy(w + c * f->bytes, w, static_cast<std::size_t>(f->bytes));
  return *f;
}

// kernels::silu_mul over `elements` gates (SmolLM2's MLP: 1536 a token row), one thread, with
// elements/s.
void run_silu_mul(benchmark::State& state, std::int64_t elements) {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> gate(static_cast<std::size_t>(elements)), up(gate.size());
  for (float& g : gate) g = dist(rng);
  for (float& u : up) u = dist(rng);
  for (auto _ : state) {
    silu_mul(gate, up);
    benchmark::DoNotOptimize(up.data());
    benchmark::ClobberMemory();
  }
  state.counters["elements_per_second"] =
      benchmark::Counter(static_cast<double>(elements) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
}

// Y = X W^T for `rows` token rows; bytes/s counts W's bytes once per call (what must stream).
void run_weight_matmul(benchmark::State& state, WeightType type, std::int64_t rows, int threads) {
  constexpr std::int64_t kOut = 4096, kIn = 14336;
  const WeightFixture& f = weight_of(type, kOut, kIn);
  const std::vector<float> x = random_floats(static_cast<std::size_t>(rows * kIn), 8);
  std::vector<float> y(static_cast<std::size_t>(rows * kOut));
  std::int64_t copy = 0;
  for (auto _ : state) {
    const WeightView w{type, kOut, kIn, f.data.data() + copy * f.bytes};
    matmul(w, x, y, pool_of(threads));
    copy = (copy + 1) % f.copies;
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * f.bytes);
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * rows), benchmark::Counter::kIsRate);
  state.SetLabel(matmul_uses_amx(type) ? "AMX" : matmul_target());
}

// The same in the kBlockSum order (BM_WeightMatmul/<dtype>_blocksum/...): every copy of W packed
// once (pack_weight, as a runner does at load) where this CPU's path reads the packed layout.
// W is 4096 x 14336 unless `out` x `in` is given (BM_WeightMatmul/<dtype>_blocksum/<out>x<in>/...:
// SmolLM2's up projection, whose short rows make 18-block panels).
void run_weight_matmul_blocksum(benchmark::State& state, WeightType type, std::int64_t rows,
                                int threads, std::int64_t out = 4096, std::int64_t in = 14336) {
  const WeightFixture& f = weight_of(type, out, in);
  // The packed copies of the fixture's weight (one shape at a time, as weight_of keeps).
  static std::tuple<WeightType, std::int64_t, std::int64_t> packed_shape;
  static std::vector<PackedWeight> copies;
  if (packed_shape != std::tuple{type, out, in}) {
    copies.clear();
    packed_shape = {type, out, in};
    if (matmul_reads_packed(type)) {
      for (std::int64_t c = 0; c < f.copies; ++c)
        copies.push_back(pack_weight({type, out, in, f.data.data() + c * f.bytes}));
    }
  }
  const std::vector<float> x = random_floats(static_cast<std::size_t>(rows * in), 8);
  std::vector<float> y(static_cast<std::size_t>(rows * out));
  std::int64_t copy = 0;
  for (auto _ : state) {
    WeightView w{type, out, in, f.data.data() + copy * f.bytes, ReductionOrder::kBlockSum};
    if (!copies.empty()) w.packed = copies[static_cast<std::size_t>(copy)].data();
    matmul(w, x, y, pool_of(threads));
    copy = (copy + 1) % f.copies;
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * f.bytes);
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * rows), benchmark::Counter::kIsRate);
  state.SetLabel(std::string(matmul_target()) + (copies.empty() ? "" : " packed"));
}

// Streaming read of a buffer far larger than the last-level cache, split evenly over the
// threads: the memory bandwidth those threads see, the ceiling for decode.
// The sum of words[0, n) read as 8 interleaved streams (8 equal parts in lockstep): one core
// pulls ~40% more from memory that way than from one stream (2 threads on the development VM:
// ~30 against ~22 GB/s), as the weight products' 4-row tiles do, and in the widest vectors the
// CPU has (GCC's function clones; at SSE2 the adds themselves cap the loop near 23 GB/s). So
// the yardstick is what this machine can read, not what one simple loop does.
__attribute__((target_clones("avx512f", "avx2", "default"))) std::uint64_t sum_streams(
    const std::uint64_t* words, std::size_t n) {
  constexpr std::size_t kStreams = 8;
  const std::size_t stride = n / kStreams / 8 * 8;
  std::uint64_t sum[kStreams][8] = {};
  for (std::size_t i = 0; i < stride; i += 8) {
    for (std::size_t k = 0; k < kStreams; ++k) {
      const std::uint64_t* p = words + k * stride + i;
      for (std::size_t j = 0; j < 8; ++j) sum[k][j] += p[j];
    }
  }
  std::uint64_t total = 0;
  for (const auto& stream : sum)
    for (std::uint64_t s : stream) total += s;
  for (std::size_t i = kStreams * stride; i < n; ++i) total += words[i];
  return total;
}

void run_stream(benchmark::State& state, std::int64_t bytes, int threads) {
  static std::vector<std::uint64_t> buffer;
  const auto words = static_cast<std::size_t>(bytes / 8);
  if (buffer.size() != words) {
    buffer.assign(words, 0);
    std::iota(buffer.begin(), buffer.end(), std::uint64_t{1});
  }
  std::vector<std::uint64_t> sums(static_cast<std::size_t>(threads));
  const auto read = [&](std::int64_t part, int) {
    const std::size_t begin = words * static_cast<std::size_t>(part) / sums.size();
    const std::size_t end = words * static_cast<std::size_t>(part + 1) / sums.size();
    sums[static_cast<std::size_t>(part)] = sum_streams(buffer.data() + begin, end - begin);
  };
  for (auto _ : state) {
    if (ThreadPool* pool = pool_of(threads)) {
      pool->parallel_for(threads, read);
    } else {
      read(0, 0);
    }
    benchmark::DoNotOptimize(sums.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * bytes);
}

// The compute yardstick beside the memory one: independent chains of the widest multiply-add
// the CPU has, so a kernel that streams little but multiplies much (a 16-row step of SmolLM2's
// q4_1 products, a 5-row verify's extra rows) can be put against what the cores can do at all.
// vpdpbusd (AVX512-VNNI, 64 byte products an instruction) is what the packed block products run;
// vfmadd on 32-bit floats (16 lanes with AVX-512, 8 with AVX2) what the float paths run.
// Twelve accumulators: more than the instructions' latency times their issue rate, so neither
// latency nor a dependency limits the loop. Returns multiply-adds done.
constexpr std::int64_t kPeakIterations = 1 << 22;
constexpr int kPeakChains = 12;

__attribute__((target("avx512f,avx512bw,avx512vnni"))) std::int64_t vnni_peak(std::int32_t seed) {
  __m512i acc[kPeakChains];
  for (int c = 0; c < kPeakChains; ++c) acc[c] = _mm512_set1_epi32(seed + c);
  __m512i x = _mm512_set1_epi8(3);
  const __m512i w = _mm512_set1_epi8(5);
  for (std::int64_t i = 0; i < kPeakIterations; ++i) {
    for (int c = 0; c < kPeakChains; ++c) acc[c] = _mm512_dpbusd_epi32(acc[c], x, w);
    asm volatile("" : "+v"(x));  // x "changes": the products are not hoisted out of the loop
  }
  __m512i total = acc[0];
  for (int c = 1; c < kPeakChains; ++c) total = _mm512_add_epi32(total, acc[c]);
  std::int32_t lanes[16];
  _mm512_storeu_si512(lanes, total);
  benchmark::DoNotOptimize(lanes);
  return kPeakIterations * kPeakChains * 64;
}

// The chains' sum, kept from the optimiser, so the loops above it are not removed.
__attribute__((target("avx512f"))) void keep_chains(const __m512 (&acc)[kPeakChains]) {
  __m512 total = acc[0];
  for (int c = 1; c < kPeakChains; ++c) total = _mm512_add_ps(total, acc[c]);
  float lanes[16];
  _mm512_storeu_ps(lanes, total);
  benchmark::DoNotOptimize(lanes);
}

__attribute__((target("avx512f"))) std::int64_t fma_peak_512(float seed) {
  __m512 acc[kPeakChains];
  for (int c = 0; c < kPeakChains; ++c) acc[c] = _mm512_set1_ps(seed + static_cast<float>(c));
  __m512 x = _mm512_set1_ps(1.0001f);
  const __m512 w = _mm512_set1_ps(0.9999f);
  for (std::int64_t i = 0; i < kPeakIterations; ++i) {
    for (int c = 0; c < kPeakChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], x, w);
    asm volatile("" : "+v"(x));
  }
  keep_chains(acc);
  return kPeakIterations * kPeakChains * 16;
}

// VDPBF16PS (AVX512-BF16): 32 bf16 products a lane pair per instruction, bfloat16's blocksum
// order.
__attribute__((target("avx512f,avx512bw,avx512bf16"))) std::int64_t bf16_dot_peak(float seed) {
  __m512 acc[kPeakChains];
  for (int c = 0; c < kPeakChains; ++c) acc[c] = _mm512_set1_ps(seed + static_cast<float>(c));
  __m512i x = _mm512_set1_epi16(0x3F80);  // bf16 1.0
  const __m512i w = _mm512_set1_epi16(0x3F80);
  for (std::int64_t i = 0; i < kPeakIterations; ++i) {
    for (int c = 0; c < kPeakChains; ++c)
      acc[c] =
          _mm512_dpbf16_ps(acc[c], reinterpret_cast<__m512bh>(x), reinterpret_cast<__m512bh>(w));
    asm volatile("" : "+v"(x));
  }
  keep_chains(acc);
  return kPeakIterations * kPeakChains * 32;
}

bool cpu_has_avx512_bf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7 || !__builtin_cpu_supports("avx512bw")) return false;
  __cpuid_count(7, 1, a, b, c, d);
  return ((a >> 5) & 1u) != 0;
}

__attribute__((target("avx2,fma"))) std::int64_t fma_peak_256(float seed) {
  __m256 acc[kPeakChains];
  for (int c = 0; c < kPeakChains; ++c) acc[c] = _mm256_set1_ps(seed + static_cast<float>(c));
  __m256 x = _mm256_set1_ps(1.0001f);
  const __m256 w = _mm256_set1_ps(0.9999f);
  for (std::int64_t i = 0; i < kPeakIterations; ++i) {
    for (int c = 0; c < kPeakChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], x, w);
    asm volatile("" : "+x"(x));
  }
  __m256 total = acc[0];
  for (int c = 1; c < kPeakChains; ++c) total = _mm256_add_ps(total, acc[c]);
  float lanes[8];
  _mm256_storeu_ps(lanes, total);
  benchmark::DoNotOptimize(lanes);
  return kPeakIterations * kPeakChains * 8;
}

enum class Peak { kVnniInt8, kBf16Dot, kFmaF32 };

void run_compute_peak(benchmark::State& state, Peak peak, int threads) {
  const bool avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (peak == Peak::kVnniInt8 && !__builtin_cpu_supports("avx512vnni")) {
    state.SkipWithError("this CPU has no AVX512-VNNI");
    return;
  }
  if (peak == Peak::kBf16Dot && !cpu_has_avx512_bf16()) {
    state.SkipWithError("this CPU has no AVX512-BF16");
    return;
  }
  if (peak == Peak::kFmaF32 && !avx2_fma) {
    state.SkipWithError("this CPU has no AVX2 and FMA");
    return;
  }
  const int lanes = __builtin_cpu_supports("avx512f") ? 16 : 8;
  std::vector<std::int64_t> macs(static_cast<std::size_t>(threads));
  const auto spin = [&](std::int64_t part, int) {
    const auto seed = static_cast<std::int32_t>(part);
    std::int64_t& done = macs[static_cast<std::size_t>(part)];
    switch (peak) {
      case Peak::kVnniInt8:
        done = vnni_peak(seed);
        break;
      case Peak::kBf16Dot:
        done = bf16_dot_peak(static_cast<float>(seed));
        break;
      case Peak::kFmaF32:
        done = lanes == 16 ? fma_peak_512(static_cast<float>(seed))
                           : fma_peak_256(static_cast<float>(seed));
        break;
    }
  };
  std::int64_t total = 0;
  for (auto _ : state) {
    if (ThreadPool* pool = pool_of(threads)) {
      pool->parallel_for(threads, spin);
    } else {
      spin(0, 0);
    }
    total += std::accumulate(macs.begin(), macs.end(), std::int64_t{0});
  }
  state.counters["macs_per_second"] =
      benchmark::Counter(static_cast<double>(total), benchmark::Counter::kIsRate);
  state.SetLabel(peak == Peak::kVnniInt8  ? "vpdpbusd zmm"
                 : peak == Peak::kBf16Dot ? "vdpbf16ps zmm"
                 : lanes == 16            ? "vfmadd zmm"
                                          : "vfmadd ymm");
}

const bool registered = [] {
  std::vector<int> thread_counts = {1};
  const int all = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (all > 1) thread_counts.push_back(all);
  for (int t : thread_counts) {
    const std::string th = "/threads:" + std::to_string(t);
    benchmark::RegisterBenchmark(("BM_StreamRead" + th).c_str(),
                                 [t](benchmark::State& s) { run_stream(s, kBeyondCaches, t); })
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    for (const auto& [peak, name] :
         {std::pair{Peak::kVnniInt8, "vnni_int8"}, std::pair{Peak::kBf16Dot, "bf16_dot"},
          std::pair{Peak::kFmaF32, "fma_f32"}}) {
      benchmark::RegisterBenchmark((std::string("BM_ComputePeak/") + name + th).c_str(),
                                   [=](benchmark::State& s) { run_compute_peak(s, peak, t); })
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
    for (DType dtype : {DType::kBfloat16, DType::kFp8E4m3}) {
      for (std::int64_t ctx : {1024, 2048, 8192, 32768}) {
        for (bool paged : {false, true}) {
          const std::string name = std::string("BM_Decode/") + (paged ? "paged/" : "contiguous/") +
                                   std::string(to_string(dtype)) + "/ctx:" + std::to_string(ctx) +
                                   th;
          benchmark::RegisterBenchmark(
              name.c_str(), [=](benchmark::State& s) { run_decode(s, dtype, ctx, paged, t); })
              ->Unit(benchmark::kMicrosecond)
              ->UseRealTime();
        }
      }
    }
    // HND pages (trtllm-gen's layout: a KV head's tokens side by side in each page), float and
    // bf16-pair orders.
    for (DType dtype : {DType::kBfloat16, DType::kFp8E4m3}) {
      for (AttentionOrder order : {AttentionOrder::kFloat, AttentionOrder::kBf16Pairs}) {
        const std::string name =
            std::string(to_string(dtype)) + (order == AttentionOrder::kBf16Pairs ? "_pairs" : "");
        for (std::int64_t ctx : {8192, 32768}) {
          benchmark::RegisterBenchmark(
              ("BM_Decode/paged_hnd/" + name + "/ctx:" + std::to_string(ctx) + th).c_str(),
              [=](benchmark::State& s) {
                run_decode(s, dtype, ctx, true, t, order, attn::KvLayout::kHND);
              })
              ->Unit(benchmark::kMicrosecond)
              ->UseRealTime();
        }
      }
    }
    // The bf16-pair order (AttentionOrder::kBf16Pairs) over the same bf16 and e4m3 caches.
    for (DType dtype : {DType::kBfloat16, DType::kFp8E4m3}) {
      const std::string order = std::string(to_string(dtype)) + "_pairs";
      for (std::int64_t ctx : {8192, 32768}) {
        benchmark::RegisterBenchmark(
            ("BM_Decode/paged/" + order + "/ctx:" + std::to_string(ctx) + th).c_str(),
            [=](benchmark::State& s) {
              run_decode(s, dtype, ctx, true, t, AttentionOrder::kBf16Pairs);
            })
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime();
        for (std::int64_t rows : {1, 2, 5, 8}) {
          benchmark::RegisterBenchmark(
              ("BM_DecodeMultiRow/" + order + "/rows:" + std::to_string(rows) +
               "/ctx:" + std::to_string(ctx) + th)
                  .c_str(),
              [=](benchmark::State& s) {
                run_multi_row(s, dtype, rows, ctx, t, AttentionOrder::kBf16Pairs);
              })
              ->Unit(benchmark::kMicrosecond)
              ->UseRealTime();
        }
      }
    }
    for (DType dtype : {DType::kBfloat16, DType::kFp8E4m3}) {
      for (std::int64_t ctx : {128, 512}) {
        const std::string name = "BM_DecodeBatch/" + std::string(to_string(dtype)) +
                                 "/requests:16/ctx:" + std::to_string(ctx) + th;
        benchmark::RegisterBenchmark(
            name.c_str(), [=](benchmark::State& s) { run_decode_batch(s, dtype, 16, ctx, t); })
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime();
      }
    }
    for (DType dtype : {DType::kBfloat16, DType::kFp8E4m3}) {
      for (std::int64_t ctx : {8192, 32768}) {
        for (std::int64_t rows : {1, 2, 5, 8}) {
          const std::string name = "BM_DecodeMultiRow/" + std::string(to_string(dtype)) +
                                   "/rows:" + std::to_string(rows) + "/ctx:" + std::to_string(ctx) +
                                   th;
          benchmark::RegisterBenchmark(
              name.c_str(), [=](benchmark::State& s) { run_multi_row(s, dtype, rows, ctx, t); })
              ->Unit(benchmark::kMicrosecond)
              ->UseRealTime();
        }
      }
    }
    for (std::int64_t rows : {1, 2, 5, 8}) {
      benchmark::RegisterBenchmark(
          ("BM_DecodeMultiRow/smollm2/float16/rows:" + std::to_string(rows) + "/ctx:128" + th)
              .c_str(),
          [=](benchmark::State& s) { run_multi_row_smollm2(s, rows, 128, t); })
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime();
    }
    for (std::int64_t tokens : {512, 2048}) {
      benchmark::RegisterBenchmark(
          ("BM_Prefill/bfloat16/tokens:" + std::to_string(tokens) + th).c_str(),
          [=](benchmark::State& s) { run_prefill(s, DType::kBfloat16, tokens, t); })
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
    for (WeightType type : {WeightType::kBfloat16, WeightType::kFloat16, WeightType::kQ8_0,
                            WeightType::kQ4_0, WeightType::kQ4_1}) {
      for (std::int64_t rows : {1, 2, 4, 5, 8, 16, 64}) {
        benchmark::RegisterBenchmark(
            ("BM_WeightMatmul/" + std::string(to_string(type)) + "/rows:" + std::to_string(rows) +
             th)
                .c_str(),
            [=](benchmark::State& s) { run_weight_matmul(s, type, rows, t); })
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      }
    }
    for (WeightType type :
         {WeightType::kBfloat16, WeightType::kQ8_0, WeightType::kQ4_0, WeightType::kQ4_1}) {
      for (std::int64_t rows : {1, 2, 4, 5, 8, 16, 64}) {
        benchmark::RegisterBenchmark(
            ("BM_WeightMatmul/" + std::string(to_string(type)) +
             "_blocksum/rows:" + std::to_string(rows) + th)
                .c_str(),
            [=](benchmark::State& s) { run_weight_matmul_blocksum(s, type, rows, t); })
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      }
    }
    for (WeightType type : {WeightType::kBfloat16, WeightType::kQ8_0, WeightType::kQ4_1}) {
      for (std::int64_t rows : {1, 2, 3, 5, 8, 16}) {
        benchmark::RegisterBenchmark(
            ("BM_WeightMatmul/" + std::string(to_string(type)) +
             "_blocksum/1536x576/rows:" + std::to_string(rows) + th)
                .c_str(),
            [=](benchmark::State& s) { run_weight_matmul_blocksum(s, type, rows, t, 1536, 576); })
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime();
      }
    }
    if (t == 1) {  // silu_mul runs on its caller's thread
      for (std::int64_t rows : {1, 16}) {
        benchmark::RegisterBenchmark(
            ("BM_SiluMul/smollm2/rows:" + std::to_string(rows) + th).c_str(),
            [=](benchmark::State& s) { run_silu_mul(s, rows * 1536); })
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime();
      }
    }
    benchmark::RegisterBenchmark(("BM_Matmul/n:768" + th).c_str(),
                                 [t](benchmark::State& s) { run_matmul(s, 768, t); })
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  return true;
}();

}  // namespace
