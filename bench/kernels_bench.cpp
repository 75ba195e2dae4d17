// Decode attention over paged K/V against the same kernel over contiguous K/V (same bytes, one
// kernel page holding the whole context), and the machine's streaming-read bandwidth measured in
// the same run, so decode bandwidth can be read as a fraction of it. Issue 5 aims at paged within
// 10% of contiguous and a large share of the streaming bandwidth.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "mixkv/attention_kernel.hpp"

namespace {

using namespace mixkv;
using namespace mixkv::kernels;

// One Llama-style layer: 32 query heads, 8 KV heads of 128, bf16 cache.
constexpr int kQHeads = 32;
constexpr int kKvHeads = 8;
constexpr int kHead = 128;
constexpr std::int64_t kPageTokens = 16;

AttentionSpec bench_spec() {
  AttentionSpec spec;
  spec.params.kv_dtype = DType::kBfloat16;
  spec.params.num_q_heads = kQHeads;
  spec.params.num_kv_heads = kKvHeads;
  spec.params.scale = 0.08838834764831845;
  spec.head_size = kHead;
  spec.head_size_v = kHead;
  return spec;
}

// A cache of `context` tokens in kernel pages of `page_tokens`, in shuffled page order when
// paged; every element a random bf16 in [-2, 2).
struct DecodeFixture {
  layout::LayerGeometry layer;
  std::vector<std::byte> cache;
  std::vector<std::int64_t> pages;
  std::vector<float> query;
  std::vector<float> out;
};

DecodeFixture make_fixture(std::int64_t context, bool paged) {
  DecodeFixture f;
  const std::int64_t page_tokens = paged ? kPageTokens : context;
  auto& l = f.layer;
  l.layer = paged ? "paged" : "contiguous";
  l.kernel_tokens = page_tokens;
  l.block_tokens = page_tokens;
  l.k_token_bytes = std::int64_t{kKvHeads} * kHead * 2;
  l.v_token_bytes = l.k_token_bytes;
  l.kernel_page_bytes = page_tokens * (l.k_token_bytes + l.v_token_bytes);
  l.kernel_page_stride = l.kernel_page_bytes;
  l.v_offset = page_tokens * l.k_token_bytes;
  const std::int64_t num_pages = context / page_tokens;
  f.cache.resize(static_cast<std::size_t>(num_pages * l.kernel_page_stride));
  std::uint64_t x = 0x9E3779B97F4A7C15ull;
  for (std::size_t i = 0; i + 1 < f.cache.size(); i += 2) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    // bf16 with exponent 2^-1..2^0 and a random sign and mantissa.
    const auto bits = static_cast<std::uint16_t>(0x3F00u | ((x >> 33) & 0x80FFu));
    f.cache[i] = static_cast<std::byte>(bits & 0xFF);
    f.cache[i + 1] = static_cast<std::byte>(bits >> 8);
  }
  f.pages.resize(static_cast<std::size_t>(num_pages));
  std::iota(f.pages.begin(), f.pages.end(), 0);
  if (paged) std::shuffle(f.pages.begin(), f.pages.end(), std::mt19937_64(1));
  std::mt19937_64 rng(2);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  f.query.resize(kQHeads * kHead);
  for (auto& q : f.query) q = dist(rng);
  f.out.resize(kQHeads * kHead);
  return f;
}

DecodeFixture& fixture(std::int64_t context, bool paged) {
  static std::map<std::pair<std::int64_t, bool>, std::unique_ptr<DecodeFixture>> cache;
  auto& slot = cache[{context, paged}];
  if (!slot) slot = std::make_unique<DecodeFixture>(make_fixture(context, paged));
  return *slot;
}

void run_decode(benchmark::State& state, bool paged) {
  const std::int64_t context = state.range(0);
  DecodeFixture& f = fixture(context, paged);
  const AttentionSpec spec = bench_spec();
  const std::vector<PagedSequence> batch = {{f.pages, context, 1}};
  const AttentionInputs inputs{f.cache, batch, f.query, {}, {}};
  for (auto _ : state) {
    paged_attention(spec, f.layer, inputs, f.out);
    benchmark::DoNotOptimize(f.out.data());
    benchmark::ClobberMemory();
  }
  // Bytes of K and V the kernel reads per call.
  state.SetBytesProcessed(state.iterations() * context * 2 * kKvHeads * kHead * 2);
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * context), benchmark::Counter::kIsRate);
}

void BM_PagedDecode(benchmark::State& state) { run_decode(state, true); }
void BM_ContiguousDecode(benchmark::State& state) { run_decode(state, false); }

// Streaming read of a buffer far larger than the last-level cache: the memory bandwidth one
// thread sees, the ceiling for the single-threaded decode above.
void BM_StreamRead(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  static std::vector<std::uint64_t> buffer;
  if (buffer.size() != bytes / 8) {
    buffer.assign(bytes / 8, 0);
    std::iota(buffer.begin(), buffer.end(), std::uint64_t{1});
  }
  for (auto _ : state) {
    std::uint64_t sum[8] = {};
    for (std::size_t i = 0; i + 8 <= buffer.size(); i += 8) {
      for (int j = 0; j < 8; ++j) sum[j] += buffer[i + static_cast<std::size_t>(j)];
    }
    std::uint64_t total = 0;
    for (auto s : sum) total += s;
    benchmark::DoNotOptimize(total);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
}

BENCHMARK(BM_StreamRead)->Arg(std::int64_t{256} << 20)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ContiguousDecode)->Arg(1024)->Arg(8192)->Arg(32768)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PagedDecode)->Arg(1024)->Arg(8192)->Arg(32768)->Unit(benchmark::kMicrosecond);

}  // namespace
