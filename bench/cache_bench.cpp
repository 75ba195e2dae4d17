// Run-time cache primitives: what one block costs to hand out and take back, to hash, and to find
// in the prefix map. Issue 6 aims at 100x below vLLM's Python manager; these are the floor under
// every per-step figure the managers will report.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "mixkv/cache/block_hash.hpp"
#include "mixkv/cache/block_pool.hpp"

namespace {

using namespace mixkv::cache;

// Allocates and frees a request's worth of blocks, half of them cached so that reallocation pays
// for lazy eviction as it would in a warm server.
void BM_BlockPoolAllocateFree(benchmark::State& state) {
  const auto per_request = static_cast<std::int32_t>(state.range(0));
  const std::int32_t num_blocks = 1 << 16;
  BlockPool pool(num_blocks);
  std::vector<BlockId> table;
  table.reserve(static_cast<std::size_t>(per_request));
  std::uint64_t next_hash = 1;
  for (auto _ : state) {
    table.clear();
    if (!pool.allocate(per_request, table)) state.SkipWithError("pool exhausted");
    for (std::size_t i = 0; i < table.size(); i += 2) {
      (void)pool.cache_block(table[i], BlockHash{next_hash, next_hash}, GroupId{0});
      ++next_hash;
    }
    pool.free(table);
    benchmark::DoNotOptimize(table.data());
  }
  const double blocks = static_cast<double>(state.iterations()) * per_request;
  state.counters["ns_per_block"] =
      benchmark::Counter(blocks, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["metadata_bytes_per_block"] = pool.metadata_bytes_per_block();
  state.counters["evictions"] = static_cast<double>(pool.counters().evictions);
}
BENCHMARK(BM_BlockPoolAllocateFree)->Arg(1)->Arg(64)->Arg(1024);

// Plain allocate + free with no caching: the free-queue cost alone.
void BM_BlockPoolAllocateFreeUncached(benchmark::State& state) {
  const auto per_request = static_cast<std::int32_t>(state.range(0));
  BlockPool pool(1 << 16);
  std::vector<BlockId> table;
  table.reserve(static_cast<std::size_t>(per_request));
  for (auto _ : state) {
    table.clear();
    if (!pool.allocate(per_request, table)) state.SkipWithError("pool exhausted");
    pool.free(table);
    benchmark::DoNotOptimize(table.data());
  }
  const double blocks = static_cast<double>(state.iterations()) * per_request;
  state.counters["ns_per_block"] =
      benchmark::Counter(blocks, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_BlockPoolAllocateFreeUncached)->Arg(1)->Arg(64);

// Hashes a prompt of range(0) tokens in 16-token blocks (1,024 tokens: the admission case).
void BM_HashBlocks(benchmark::State& state) {
  const auto num_tokens = static_cast<std::size_t>(state.range(0));
  std::vector<TokenId> tokens(num_tokens);
  std::mt19937 rng(7);
  for (auto& t : tokens) t = static_cast<TokenId>(rng() % 150000);
  BlockHasher hasher(16, 42);
  const SequenceKeys keys;
  std::vector<BlockHash> hashes;
  hashes.reserve(num_tokens / 16);
  for (auto _ : state) {
    hashes.clear();
    hasher.extend(tokens, keys, hashes);
    benchmark::DoNotOptimize(hashes.data());
  }
  const std::size_t full_blocks = num_tokens / 16;
  const double blocks = static_cast<double>(state.iterations()) * static_cast<double>(full_blocks);
  state.counters["ns_per_block"] =
      benchmark::Counter(blocks, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["time_per_prompt"] =
      benchmark::Counter(static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_HashBlocks)->Arg(16)->Arg(1024)->Arg(16384);

// Looks up a cached 1,024-token prefix (64 blocks) in a pool of range(0) blocks, all cached, the
// way a coordinator scans for the longest hit. The large pool shows the cost once the map is out of
// cache.
void BM_PrefixLookup(benchmark::State& state) {
  const std::int32_t num_blocks = static_cast<std::int32_t>(state.range(0));
  BlockPool pool(num_blocks);
  std::vector<BlockId> all;
  if (!pool.allocate(num_blocks - 1, all)) state.SkipWithError("allocation failed");
  std::vector<TokenId> tokens(static_cast<std::size_t>(num_blocks - 1) * 16);
  std::iota(tokens.begin(), tokens.end(), 0);
  const auto hashes = hash_blocks(tokens, 16, {}, 42);
  for (std::size_t i = 0; i < all.size(); ++i) {
    (void)pool.cache_block(all[i], hashes[i], GroupId{0});
  }
  pool.free(all);  // all free and cached: lookups see a full map
  const std::size_t prefix_blocks = 64;
  std::size_t start = 0;
  std::int64_t found = 0;
  for (auto _ : state) {
    for (std::size_t i = 0; i < prefix_blocks; ++i) {
      const auto hit = pool.lookup(hashes[(start + i) % hashes.size()], GroupId{0});
      found += hit.has_value();
    }
    start = (start + 977) % hashes.size();
  }
  benchmark::DoNotOptimize(found);
  const double lookups = static_cast<double>(state.iterations()) * prefix_blocks;
  state.counters["ns_per_lookup"] =
      benchmark::Counter(lookups, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["hit_rate"] =
      static_cast<double>(pool.counters().hits) /
      static_cast<double>(std::max<std::int64_t>(1, pool.counters().queries));
}
BENCHMARK(BM_PrefixLookup)->Arg(4096)->Arg(1 << 20);

}  // namespace
