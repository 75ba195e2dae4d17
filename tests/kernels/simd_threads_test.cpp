// What the Highway kernels and the thread pool add: every stored code of every dtype is read
// exactly (in registers for decode, through scratch otherwise); kernels::ThreadPool on its own;
// and outputs bit-identical whatever the pool's size and whatever else is in the batch (a
// batch-invariant engine relies on it).
#include "mixkv/kernels/thread_pool.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>

#include "kernels/kernels_test_support.hpp"
#include "kernels/line_aligned.hpp"
#include "mixkv/kernels/attention_kernel.hpp"
#include "mixkv/kernels/simd_targets.hpp"
#include "test_support.hpp"

namespace mixkv::kernels {
namespace simd_threads_test {  // named: its helpers meet other files' in a unity batch
namespace {

TEST(ThreadPool, RunsEveryTaskOnceOnEveryWorker) {
  for (int workers : {1, 2, 5}) {
    ThreadPool pool(workers);
    EXPECT_EQ(pool.size(), workers);
    for (std::int64_t count : {0, 1, 3, 1000}) {
      std::vector<std::atomic<int>> runs(static_cast<std::size_t>(count));
      std::atomic<bool> bad_worker{false};
      pool.parallel_for(count, [&](std::int64_t i, int worker) {
        runs[static_cast<std::size_t>(i)].fetch_add(1);
        if (worker < 0 || worker >= workers) bad_worker = true;
      });
      for (std::int64_t i = 0; i < count; ++i)
        EXPECT_EQ(runs[static_cast<std::size_t>(i)].load(), 1) << workers << " workers, task " << i;
      EXPECT_FALSE(bad_worker);
    }
  }
}

TEST(ThreadPool, RethrowsATaskErrorAndStaysUsable) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.parallel_for(50,
                                 [](std::int64_t i, int) {
                                   if (i == 17) throw std::runtime_error("task 17");
                                 }),
               std::runtime_error);
  std::atomic<int> done{0};
  pool.parallel_for(20, [&](std::int64_t, int) { ++done; });
  EXPECT_EQ(done.load(), 20);
}

// Regions much smaller than a wake-up, back to back, as a decode step runs them: every task of
// every region runs once, and no worker is left inside a region when the next one is set up
// (a task of an old region running late would count into the new one's tally).
TEST(ThreadPool, ManySmallRegionsBackToBackEachRunOnce) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> runs(8);
  for (int region = 0; region < 3000; ++region) {
    const std::int64_t count = 2 + region % 7;
    for (auto& r : runs) r.store(0, std::memory_order_relaxed);
    pool.parallel_for(count, [&](std::int64_t i, int) {
      runs[static_cast<std::size_t>(i)].fetch_add(1, std::memory_order_relaxed);
    });
    for (std::int64_t i = 0; i < 8; ++i) {
      ASSERT_EQ(runs[static_cast<std::size_t>(i)].load(), i < count ? 1 : 0)
          << "region " << region << ", task " << i;
    }
  }
}

// A two-phase region: every first-phase index runs once, and every second-phase task starts
// only after all of them finished, whichever thread ran them (each task sees their writes);
// many such regions back to back, on pools of every size.
TEST(ThreadPool, TwoPhasesRunTheSecondOnlyAfterTheWholeFirst) {
  for (int workers : {1, 2, 3}) {
    ThreadPool pool(workers);
    for (int region = 0; region < 2000; ++region) {
      const std::int64_t first_count = region % 5, count = region % 7;
      std::vector<int> written(static_cast<std::size_t>(first_count), 0);  // plain: ordered
      std::atomic<int> first_runs{0}, tasks{0}, early{0};
      pool.parallel_for(
          first_count,
          [&](std::int64_t i, int) {
            written[static_cast<std::size_t>(i)] += 1;
            first_runs.fetch_add(1, std::memory_order_relaxed);
          },
          count,
          [&](std::int64_t, int) {
            for (const int w : written) {
              if (w != 1) early.fetch_add(1, std::memory_order_relaxed);
            }
            tasks.fetch_add(1, std::memory_order_relaxed);
          });
      ASSERT_EQ(first_runs.load(), first_count) << workers << " workers, region " << region;
      ASSERT_EQ(tasks.load(), count) << workers << " workers, region " << region;
      ASSERT_EQ(early.load(), 0) << "a task started before the first phase ended, " << workers
                                 << " workers, region " << region;
    }
  }
}

TEST(ThreadPool, AFirstPhaseErrorSkipsTheSecondAndIsRethrown) {
  ThreadPool pool(3);
  std::atomic<int> tasks{0};
  EXPECT_THROW(pool.parallel_for(
                   8,
                   [](std::int64_t i, int) {
                     if (i == 5) throw std::runtime_error("first phase, index 5");
                   },
                   40, [&](std::int64_t, int) { tasks.fetch_add(1); }),
               std::runtime_error);
  EXPECT_EQ(tasks.load(), 0);
  pool.parallel_for(
      2, [](std::int64_t, int) {}, 20, [&](std::int64_t, int) { tasks.fetch_add(1); });
  EXPECT_EQ(tasks.load(), 20);
}

TEST(ThreadPool, CallersOnSeveralThreadsTakeTurns) {
  ThreadPool pool(2);
  std::atomic<std::int64_t> sum{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c) {
    callers.emplace_back([&] {
      for (int region = 0; region < 300; ++region) {
        pool.parallel_for(5, [&](std::int64_t i, int) { sum.fetch_add(i + 1); });
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(sum.load(), 3 * 300 * 15);
}

// Workers poll for kSpinMicros, then sleep: an idle pool takes no CPU time, and the next region
// wakes its workers (counted by wakeups()) and still runs every task.
TEST(ThreadPool, AnIdlePoolSleepsAndWakesForTheNextRegion) {
  ThreadPool pool(3);
  const auto sleep_past_spin = [] {
    std::this_thread::sleep_for(std::chrono::microseconds(20 * ThreadPool::kSpinMicros));
  };
  std::atomic<int> done{0};
  // A machine with more threads than cores may not run a worker for a while: try a few times.
  for (int attempt = 0; attempt < 100 && pool.wakeups() == 0; ++attempt) {
    pool.parallel_for(4, [&](std::int64_t, int) { ++done; });
    sleep_past_spin();
    pool.parallel_for(64, [&](std::int64_t, int) { ++done; });
  }
  EXPECT_GT(pool.wakeups(), 0u) << "the workers never went to sleep";
  EXPECT_EQ(done.load() % 68, 0);
  sleep_past_spin();
  const std::clock_t before = std::clock();  // CPU time of the whole process
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const double idle_cpu = static_cast<double>(std::clock() - before) / CLOCKS_PER_SEC;
  EXPECT_LT(idle_cpu, 0.03) << "two idle workers used " << idle_cpu << " s of CPU in 0.1 s";
}

TEST(ThreadPool, RefusesZeroWorkers) {
  mixkv::testing::expect_error([] { ThreadPool pool(0); }, ErrorCode::kInvalidInput,
                               {"thread pool", "at least 1"});
}

// The placement probe: a positive time on a machine with two CPUs, after running the partner's
// start on the other thread; nothing for no trips, and nothing (not a hang) when the budget is
// spent before the warm-up ends.
// The kernels' scratch rows are read as whole vectors from their start: their buffers begin on
// a cache line whatever the element type, the size and the growth (the heap alone gives 16
// bytes, so most of these would fail with std::allocator).
template <class T>
void expect_line_aligned_buffers() {
  std::vector<detail::LineVector<T>> buffers;
  for (std::size_t n : {1u, 3u, 17u, 1000u, 100000u}) {
    buffers.emplace_back(n);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buffers.back().data()) % 64, 0u) << n;
  }
  detail::LineVector<T> grown;
  for (int i = 0; i < 5000; ++i) {
    grown.push_back(T{});
    ASSERT_EQ(reinterpret_cast<std::uintptr_t>(grown.data()) % 64, 0u) << grown.size();
  }
}

TEST(KernelScratch, StartsOnACacheLineWhateverItsTypeSizeAndGrowth) {
  expect_line_aligned_buffers<float>();
  expect_line_aligned_buffers<std::int8_t>();
  expect_line_aligned_buffers<std::uint16_t>();
  expect_line_aligned_buffers<std::int64_t>();
}

TEST(CacheLineRoundTrip, MeasuresAfterThePartnersStartAndStopsAtItsBudget) {
  if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "needs two CPUs";
  std::thread::id caller = std::this_thread::get_id(), partner;
  const std::optional<double> ns = cache_line_round_trip_ns(
      200, std::chrono::seconds(5), [&] { partner = std::this_thread::get_id(); });
  ASSERT_TRUE(ns.has_value());
  EXPECT_GT(*ns, 0.0);
  EXPECT_NE(partner, std::thread::id());
  EXPECT_NE(partner, caller);
  EXPECT_FALSE(cache_line_round_trip_ns(0).has_value());
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(cache_line_round_trip_ns(1'000'000'000, std::chrono::milliseconds(5)).has_value());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

using testing::Layer;

Layer make_layer(const AttentionSpec& spec, std::int64_t num_pages, std::int64_t page_tokens = 16) {
  return testing::make_layer(spec, num_pages, page_tokens, "threads");
}

// Runs `requests` (indices into `all`) as one batch; returns the output rows of each request.
std::vector<std::vector<float>> run_batch(const Layer& l, const std::vector<testing::Request>& all,
                                          const std::vector<std::size_t>& requests,
                                          std::span<const float> sinks, ThreadPool* pool) {
  std::vector<PagedSequence> batch;
  std::vector<float> queries;
  for (std::size_t r : requests) {
    batch.push_back({all[r].blocks, all[r].kv_len, all[r].num_queries});
    queries.insert(queries.end(), all[r].q.begin(), all[r].q.end());
  }
  const std::int64_t row = std::int64_t{l.spec.params.num_q_heads} * l.spec.head_size_v;
  std::vector<float> out(queries.size() / static_cast<std::size_t>(l.spec.head_size) *
                         static_cast<std::size_t>(l.spec.head_size_v));
  AttentionInputs inputs{l.cache, batch, queries, sinks, {}};
  inputs.pool = pool;
  paged_attention(l.spec, l.geometry, inputs, out);
  std::vector<std::vector<float>> per_request;
  std::int64_t at = 0;
  for (std::size_t r : requests) {
    const std::int64_t n = all[r].num_queries * row;
    per_request.emplace_back(out.begin() + at, out.begin() + at + n);
    at += n;
  }
  return per_request;
}

// One key per request: the softmax weight is exactly 1, so the output is the V row the kernel
// decoded. Every code of the dtype is stored in V rows and must come back as decode_row gives it
// (a zero may lose its sign: the accumulator starts at +0).
void expect_every_code_read_exactly(DType dtype, int head_size_v) {
  AttentionSpec spec;
  spec.params.kv_dtype = dtype;
  spec.params.num_q_heads = 2;
  spec.params.num_kv_heads = 1;
  spec.head_size = 32;
  spec.head_size_v = head_size_v;
  spec.params.scale = 1.0;
  const int elem = element_bytes(dtype);
  const std::int64_t codes = elem == 1 ? 256 : 65536;
  const std::int64_t requests = (codes + head_size_v - 1) / head_size_v;
  Layer l = make_layer(spec, requests);
  const KvScales scales = elem == 1 ? KvScales{1.0f, 0.375f} : KvScales{};
  std::vector<std::byte> v_bytes(static_cast<std::size_t>(requests * head_size_v * elem));
  for (std::size_t i = 0; i < v_bytes.size() / static_cast<std::size_t>(elem); ++i) {
    const auto code = static_cast<std::uint32_t>(i % static_cast<std::size_t>(codes));
    for (int b = 0; b < elem; ++b)
      v_bytes[i * static_cast<std::size_t>(elem) + static_cast<std::size_t>(b)] =
          static_cast<std::byte>((code >> (8 * b)) & 0xFF);
  }
  std::vector<std::vector<std::int64_t>> pages(static_cast<std::size_t>(requests));
  std::vector<PagedSequence> batch;
  for (std::int64_t r = 0; r < requests; ++r) {
    std::byte* page = l.cache.data() + r * l.geometry.kernel_page_stride;
    std::fill(page, page + l.geometry.k_token_bytes, std::byte{0});  // K = 0
    std::copy_n(v_bytes.begin() + r * head_size_v * elem, head_size_v * elem,
                page + l.geometry.v_offset);
    pages[static_cast<std::size_t>(r)] = {r};
    batch.push_back({pages[static_cast<std::size_t>(r)], 1, 1});
  }
  const std::vector<float> q(static_cast<std::size_t>(requests * 2 * 32), 0.5f);
  std::vector<float> out(static_cast<std::size_t>(requests * 2 * head_size_v));
  paged_attention(spec, l.geometry, AttentionInputs{l.cache, batch, q, {}, scales}, out);
  std::vector<float> expected(v_bytes.size() / static_cast<std::size_t>(elem));
  decode_row(dtype, v_bytes, scales.v, expected);
  // The AMX path flushes subnormal inputs to zero, and the weight's zero low terms meet an
  // infinite V (0 x inf): what it reads instead (attention_uses_amx documents both).
  if (attention_uses_amx(spec, l.geometry)) {
    for (float& x : expected) {
      if (std::fpclassify(x) == FP_SUBNORMAL) x = 0.0f;
      if (std::isinf(x)) x = std::numeric_limits<float>::quiet_NaN();
    }
  }
  int mismatches = 0;
  for (std::int64_t r = 0; r < requests; ++r) {
    for (int h = 0; h < 2; ++h) {
      for (int e = 0; e < head_size_v; ++e) {
        const float want = expected[static_cast<std::size_t>(r * head_size_v + e)];
        const float got = out[static_cast<std::size_t>((r * 2 + h) * head_size_v + e)];
        const bool same = std::isnan(want) ? std::isnan(got) : got == want;
        if (!same && ++mismatches <= 5) {
          ADD_FAILURE() << to_string(dtype) << " dv " << head_size_v << ": element "
                        << r * head_size_v + e << " reads " << got << ", stored " << want;
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << to_string(dtype) << " dv " << head_size_v;
}

TEST(PagedDecode, ReadsEveryStoredCodeExactly) {
  // Under every instruction set: each decodes the formats its own way (F16C or integer paths).
  for_each_simd_target([](const std::string& target) {
    SCOPED_TRACE(target);
    // 64: whole vectors, decoded in registers; 40: a tail, decoded through scratch.
    for (int dv : {64, 40}) {
      for (DType dtype : {DType::kBfloat16, DType::kFloat16, DType::kFp8E4m3, DType::kFp8E5m2}) {
        expect_every_code_read_exactly(dtype, dv);
      }
    }
  });
  // bf16 with dv 64 takes the AMX path where the CPU has it: the float paths read it too.
  set_attention_amx(false);
  expect_every_code_read_exactly(DType::kBfloat16, 64);
  set_attention_amx(true);
}

struct ThreadCase {
  std::string name;
  AttentionSpec spec;
};

std::vector<ThreadCase> thread_cases() {
  AttentionSpec gqa;
  gqa.params.kv_dtype = DType::kBfloat16;
  gqa.params.num_q_heads = 12;
  gqa.params.num_kv_heads = 3;
  gqa.head_size = 72;  // not a multiple of any vector width: tails everywhere
  gqa.head_size_v = 72;
  gqa.params.scale = 0.2;
  gqa.params.soft_cap = 20.0;
  gqa.params.sinks = true;
  gqa.params.window_left = 300;
  AttentionSpec fp8 = gqa;
  fp8.params.kv_dtype = DType::kFp8E4m3;
  fp8.params.soft_cap.reset();
  fp8.params.sinks = false;
  fp8.params.window_left = -1;
  // MLA: one latent shared by 16 heads, so the heads are split inside one KV head.
  AttentionSpec mla;
  mla.params.kv_dtype = DType::kFloat16;
  mla.params.num_q_heads = 16;
  mla.params.num_kv_heads = 1;
  mla.head_size = 80;
  mla.head_size_v = 48;
  mla.mla = true;
  mla.params.scale = 0.1;
  // SmolLM2's shape: 3 query heads per KV head of 64, read from the cache in registers; one
  // request on many workers splits a KV head's three heads, which a lone worker takes together.
  AttentionSpec smol;
  smol.params.kv_dtype = DType::kFloat16;
  smol.params.num_q_heads = 9;
  smol.params.num_kv_heads = 3;
  smol.head_size = 64;
  smol.head_size_v = 64;
  smol.params.scale = 0.125;
  return {{"gqa bf16, window, cap, sinks", gqa},
          {"gqa fp8", fp8},
          {"mla fp16", mla},
          {"gqa fp16 9/3 heads of 64", smol}};
}

// Decodes, an extend of 3 and a prefill of 40 queries (three query blocks), causal.
const std::vector<std::pair<std::int64_t, std::int64_t>> kShapes = {
    {700, 1}, {33, 3}, {120, 40}, {1, 1}, {260, 1}};

// One layer holding a request of each of kShapes (16-token pages, consecutive blocks), and sinks
// when the case has them.
struct Shapes {
  Layer layer;
  std::vector<testing::Request> requests;
  std::vector<float> sinks;
};
Shapes make_shapes(const ThreadCase& c, std::mt19937_64& rng) {
  std::int64_t pages = 1;
  for (auto [kv, nq] : kShapes) pages += (kv + 15) / 16;
  Shapes s{make_layer(c.spec, pages), {}, {}};
  Layer& l = s.layer;
  std::int64_t next = 1;
  for (auto [kv, nq] : kShapes) {
    std::vector<std::int64_t> blocks;
    for (std::int64_t i = 0; i < (kv + 15) / 16; ++i) blocks.push_back(next++);
    s.requests.push_back(
        testing::make_request(l.spec, l.geometry, {}, l.cache, blocks, kv, nq, rng));
  }
  if (c.spec.params.sinks) s.sinks = testing::random_values(rng, 12, 2.0f);
  return s;
}

TEST(PagedAttentionThreads, OutputsAreBitIdenticalWhateverTheWorkerCount) {
  for (const ThreadCase& c : thread_cases()) {
    std::mt19937_64 rng(11);
    auto [l, all, sinks] = make_shapes(c, rng);
    const std::vector<std::size_t> everyone = {0, 1, 2, 3, 4};
    const auto serial = run_batch(l, all, everyone, sinks, nullptr);
    for (int workers : {1, 2, 3, 7}) {
      ThreadPool pool(workers);
      const auto threaded = run_batch(l, all, everyone, sinks, &pool);
      for (std::size_t r = 0; r < everyone.size(); ++r) {
        EXPECT_TRUE(testing::same_bits(serial[r], threaded[r]))
            << c.name << ": request " << r << " with " << workers << " workers";
      }
    }
    // The outputs are attention, not zeros or NaN: finite and not all equal.
    for (const auto& rows : serial) {
      for (float x : rows) ASSERT_TRUE(std::isfinite(x)) << c.name;
    }
    EXPECT_NE(serial[0][0], serial[0][1]) << c.name;
  }
}

TEST(PagedAttentionThreads, ARequestAloneMatchesItselfInsideAnyBatch) {
  for (const ThreadCase& c : thread_cases()) {
    std::mt19937_64 rng(12);
    auto [l, all, sinks] = make_shapes(c, rng);
    ThreadPool pool(3);
    for (std::size_t r = 0; r < all.size(); ++r) {
      const auto alone = run_batch(l, all, {r}, sinks, &pool);
      const auto alone_serial = run_batch(l, all, {r}, sinks, nullptr);
      // Inside a batch, after and before other requests (the pool then splits heads differently).
      std::vector<std::size_t> batch = {(r + 1) % all.size(), r, (r + 2) % all.size(),
                                        (r + 3) % all.size()};
      const auto inside = run_batch(l, all, batch, sinks, &pool);
      EXPECT_TRUE(testing::same_bits(alone[0], inside[1])) << c.name << ": request " << r;
      EXPECT_TRUE(testing::same_bits(alone[0], alone_serial[0])) << c.name << ": request " << r;
    }
  }
}

// A speculative verify (or a chunked prefill) runs the k + 1 rows of one request together, each
// K/V tile read once for all of them; each row must come out exactly as the one-token decode at
// its position would give it (causal), or as a lone query over the whole block (non-causal, a
// DFlash block), so speculation stays bit-identical to plain decoding. Windows move the first
// visible key with the row, so this also pins the tile grid to positions, not to the first key.
TEST(PagedAttentionRows, EachRowOfAVerifyMatchesItsOwnDecode) {
  struct RowsCase {
    std::string name;
    DType dtype;
    int q_heads, kv_heads, head;
    int window;  // -1: none
    bool cap, sinks, causal;
    std::int64_t page_tokens;
  };
  const std::vector<RowsCase> thread_cases = {
      {"bf16 gqa window cap sinks", DType::kBfloat16, 8, 2, 64, 37, true, true, true, 16},
      {"bf16 gqa 32-token pages window", DType::kBfloat16, 8, 2, 64, 21, false, false, true, 32},
      {"fp8 mha", DType::kFp8E4m3, 4, 4, 128, -1, false, false, true, 16},
      {"fp16 head 40 window (scratch path)", DType::kFloat16, 6, 3, 40, 45, true, false, true, 16},
      {"bf16 non-causal block", DType::kBfloat16, 8, 2, 64, -1, false, true, false, 16},
  };
  // Windows that put the block's first key and each row's first key in the same page at various
  // offsets from the page start (and in the page before).
  std::vector<RowsCase> all_cases;
  for (const RowsCase& c : thread_cases) {
    all_cases.push_back(c);
    if (c.window < 0) continue;
    for (int more : {7, 24, 40}) {
      all_cases.push_back(c);
      all_cases.back().window += more;
      all_cases.back().name += " +" + std::to_string(more);
    }
  }
  for (const RowsCase& c : all_cases) {
    AttentionSpec spec;
    spec.params.kv_dtype = c.dtype;
    spec.params.num_q_heads = c.q_heads;
    spec.params.num_kv_heads = c.kv_heads;
    spec.params.scale = 0.3;
    spec.params.causal = c.causal;
    spec.params.window_left = c.window;
    if (c.cap) spec.params.soft_cap = 5.0;
    spec.params.sinks = c.sinks;
    spec.head_size = c.head;
    spec.head_size_v = c.head;
    const std::int64_t kv_len = 150;
    const std::int64_t pages = (kv_len + c.page_tokens - 1) / c.page_tokens;
    Layer l = make_layer(spec, pages + 3, c.page_tokens);
    std::mt19937_64 rng(21);
    std::vector<std::int64_t> blocks(static_cast<std::size_t>(pages + 3));
    std::iota(blocks.begin(), blocks.end(), 0);
    std::shuffle(blocks.begin(), blocks.end(), rng);
    blocks.resize(static_cast<std::size_t>(pages));
    const std::vector<float> sinks =
        c.sinks ? testing::random_values(rng, static_cast<std::size_t>(c.q_heads), 1.0f)
                : std::vector<float>{};
    for (std::int64_t rows : {2, 5, 16, 17}) {
      const auto r =
          testing::make_request(spec, l.geometry, {}, l.cache, blocks, kv_len, rows, rng);
      const std::vector<testing::Request> all = {r};
      ThreadPool pool(2);
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        const auto together = run_batch(l, all, {0}, sinks, p)[0];
        const std::size_t q_row = static_cast<std::size_t>(c.q_heads * c.head);
        for (std::int64_t i = 0; i < rows; ++i) {
          testing::Request one = r;
          one.num_queries = 1;
          if (c.causal) one.kv_len = kv_len - rows + i + 1;
          one.q.assign(r.q.begin() + static_cast<std::ptrdiff_t>(i * q_row),
                       r.q.begin() + static_cast<std::ptrdiff_t>((i + 1) * q_row));
          const std::vector<testing::Request> single = {one};
          const auto alone = run_batch(l, single, {0}, sinks, p)[0];
          const std::vector<float> mine(
              together.begin() + static_cast<std::ptrdiff_t>(i * q_row),
              together.begin() + static_cast<std::ptrdiff_t>((i + 1) * q_row));
          EXPECT_TRUE(testing::same_bits(mine, alone))
              << c.name << ": row " << i << " of " << rows << (p ? ", 2 threads" : "");
          for (float x : mine) ASSERT_TRUE(std::isfinite(x)) << c.name;
        }
      }
    }
  }
}

}  // namespace
}  // namespace simd_threads_test
}  // namespace mixkv::kernels
