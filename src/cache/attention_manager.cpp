#include "attention_manager.hpp"

#include <fmt/format.h>

#include "mixkv/core/error.hpp"

namespace mixkv::cache {

AttentionManager::AttentionManager(const GroupSetup& setup, plan::Behaviour behaviour)
    : GroupManagerBase(setup, behaviour) {
  if (block_size_ < 1) {
    throw_invalid(fmt::format("group {}: block_size is {}, expected a positive token count",
                              id_.value(), block_size_));
  }
}

void AttentionManager::release(RequestSlot slot, BlockPool& pool) {
  Slot& s = at(slot);
  pool.free(s.table);
  s = Slot{};  // releases the table's memory; the slot is reused by a later request
}

std::int64_t AttentionManager::stage_hit_from(RequestSlot slot, std::span<const BlockHash> hashes,
                                              const BlockPool& pool, std::int64_t hit,
                                              std::int64_t first_block) {
  auto& table = at(slot).table;
  const std::int64_t hit_blocks = hit / block_size_;
  std::int64_t leaving_queue = 0;
  for (std::int64_t i = 0; i < hit_blocks; ++i) {
    BlockId b = kNullBlock;
    if (i >= first_block) {
      const auto found = pool.peek(hashes[static_cast<std::size_t>(i)], id_);
      if (!found) {
        throw_internal(fmt::format("group {}: hit block {} of a {}-token hit is not cached",
                                   id_.value(), i, hit));
      }
      b = *found;
    }
    if (!b.is_null() && pool.is_free(b)) ++leaving_queue;
    table.push_back(b);
  }
  return leaving_queue;
}

void AttentionManager::take_hit(RequestSlot slot, BlockPool& pool, std::int64_t hit) {
  Slot& s = at(slot);
  pool.touch(s.table);
  s.num_cached = hit / block_size_;
}

void AttentionManager::cache_blocks(Slot& s, std::int64_t num_computed,
                                    std::span<const BlockHash> hashes, BlockPool& pool) {
  const std::int64_t full =
      std::min<std::int64_t>(num_computed / block_size_, static_cast<std::int64_t>(hashes.size()));
  for (std::int64_t i = s.num_cached; i < full; ++i) {
    const BlockId b = s.table[static_cast<std::size_t>(i)];
    if (!b.is_null()) pool.cache_block(b, hashes[static_cast<std::size_t>(i)], id_);
  }
  s.num_cached = std::max(s.num_cached, full);
}

void AttentionManager::drop_blocks(Slot& s, std::int64_t first_token, BlockPool& pool) {
  auto& table = s.table;
  const std::int64_t first = first_token / block_size_;
  for (std::int64_t i = std::min<std::int64_t>(first, static_cast<std::int64_t>(table.size())) - 1;
       i >= 0; --i) {
    BlockId& b = table[static_cast<std::size_t>(i)];
    if (b.is_null()) break;  // everything before is dropped already
    pool.free(std::span<const BlockId>(&b, 1));
    b = kNullBlock;
  }
  s.window_start = std::max(s.window_start, first);
}

std::string AttentionManager::check_table(const SequenceView& seq, const BlockPool& pool,
                                          std::vector<std::int32_t>& refs,
                                          std::int64_t first_needed_block) const {
  const auto& table = at(seq.slot).table;
  for (BlockId b : table) ++refs[static_cast<std::size_t>(b.value())];
  if (!table.empty() && static_cast<std::int64_t>(table.size()) * block_size_ < seq.num_computed) {
    return fmt::format("request {} group {}: {} computed tokens in {} blocks", seq.id, id_.value(),
                       seq.num_computed, table.size());
  }
  // The kind never drops a block its next query sees.
  for (auto i = static_cast<std::size_t>(first_needed_block); i < table.size(); ++i) {
    if (table[i].is_null()) {
      return fmt::format("request {} group {}: in-window block {} dropped", seq.id, id_.value(), i);
    }
  }
  // Nothing is cached beyond the verified, computed tokens.
  for (auto i = static_cast<std::size_t>(seq.num_computed / block_size_); i < table.size(); ++i) {
    if (!table[i].is_null() && pool.cached_hash(table[i]).has_value()) {
      return fmt::format("request {} group {}: block {} cached beyond its {} verified tokens",
                         seq.id, id_.value(), i, seq.num_computed);
    }
  }
  return "";
}

GroupStats AttentionManager::stats(const BlockPool& pool) const {
  std::int64_t held = 0;
  for (const Slot& s : slots_) {
    for (BlockId b : s.table) held += b.is_null() ? 0 : 1;
  }
  return stats_holding(held, pool);
}

}  // namespace mixkv::cache
