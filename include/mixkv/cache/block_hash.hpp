// Chained block hashes for prefix caching. A full block's hash covers its parent's hash, its token
// ids and everything else that changes its KV (LoRA adapter, multimodal items, cache salt), so two
// requests share a block only if they share everything before it. XXH3-128, seeded: the same
// inputs and seed give the same hashes in every process. docs/cache.md describes the inputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mixkv::cache {

using TokenId = std::int32_t;

// 128 bits of XXH3: collisions between distinct prefixes are negligible at any realistic cache
// size, so a map hit is trusted without comparing tokens.
struct BlockHash {
  std::uint64_t lo = 0;
  std::uint64_t hi = 0;

  bool operator==(const BlockHash&) const = default;
};
// 32 hex digits, most significant first.
std::string to_string(const BlockHash& hash);

// A multimodal item (image, audio clip) whose placeholder tokens are [offset, offset + length) of
// the request's tokens. `identifier` is the caller's content hash of the item.
struct MultimodalItem {
  std::string identifier;
  std::int64_t offset = 0;
  std::int64_t length = 0;

  bool operator==(const MultimodalItem&) const = default;
};

// What besides the tokens makes one request's KV differ from another's.
struct SequenceKeys {
  std::optional<std::int64_t> lora_id;
  std::vector<MultimodalItem> multimodal;  // sorted by offset
  // Separates tenants: hashed into the first block only, which the chain carries to the rest.
  std::optional<std::string> cache_salt;

  bool operator==(const SequenceKeys&) const = default;
};

// A multimodal item as one block sees it: `offset` is where the item starts relative to the block's
// first token (negative when it began in an earlier block).
struct MultimodalPiece {
  std::string_view identifier;
  std::int64_t offset = 0;
};

// The keys of one block, resolved from SequenceKeys by BlockHasher::extend.
struct BlockKeys {
  std::optional<std::int64_t> lora_id;
  std::span<const MultimodalPiece> multimodal;
  std::optional<std::string_view> cache_salt;
};

// Hashes the blocks of token sequences with one block size and seed. Keeps a scratch buffer, so it
// allocates nothing per block once warm; one hasher per thread.
class BlockHasher {
 public:
  // Throws kInvalidInput when block_size < 1.
  BlockHasher(std::int32_t block_size, std::uint64_t seed);

  std::int32_t block_size() const { return block_size_; }
  std::uint64_t seed() const { return seed_; }
  // The parent of a sequence's first block; depends only on the seed.
  const BlockHash& root() const { return root_; }

  BlockHash hash_block(const BlockHash& parent, std::span<const TokenId> tokens,
                       const BlockKeys& keys);

  // Appends the hashes of the full blocks of `tokens` that `hashes` does not cover yet, so a
  // request's hashes grow as its tokens arrive. `hashes` must be this sequence's earlier output.
  // Throws kInvalidInput for multimodal items out of order or with a length below 1.
  void extend(std::span<const TokenId> tokens, const SequenceKeys& keys,
              std::vector<BlockHash>& hashes);

 private:
  std::int32_t block_size_;
  std::uint64_t seed_;
  BlockHash root_;
  std::vector<unsigned char> buffer_;
  std::vector<MultimodalPiece> pieces_;
};

// One-shot forms of the above.
BlockHash hash_block(const BlockHash& parent, std::span<const TokenId> tokens,
                     const BlockKeys& keys, std::uint64_t seed);
std::vector<BlockHash> hash_blocks(std::span<const TokenId> tokens, std::int32_t block_size,
                                   const SequenceKeys& keys, std::uint64_t seed);

}  // namespace mixkv::cache

template <>
struct std::hash<mixkv::cache::BlockHash> {
  // The digest is already uniform; folding the halves is enough for a hash table.
  std::size_t operator()(const mixkv::cache::BlockHash& h) const noexcept {
    return static_cast<std::size_t>(h.lo ^ (h.hi * 0x9E3779B97F4A7C15ULL));
  }
};
