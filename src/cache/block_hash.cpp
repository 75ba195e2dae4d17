#include "mixkv/cache/block_hash.hpp"

#include <xxhash.h>

#include <bit>
#include <cstring>

#include <fmt/format.h>

#include "mixkv/core/error.hpp"

namespace mixkv::cache {

namespace {

// The bytes hashed for one block, written little-endian whatever the host, so hashes agree across
// machines (P/D instances exchange them):
//   parent.lo u64, parent.hi u64, token count u32, tokens i32...,
//   then tagged optional keys: 'L' lora_id i64 | 'M' id length u32, id bytes, offset i64 (per item)
//   | 'S' salt length u32, salt bytes.
// The explicit token count and lengths make the encoding injective: no two inputs share bytes.
class ByteWriter {
 public:
  // Sizes `out` once for the whole block, so writes are plain stores.
  ByteWriter(std::vector<unsigned char>& out, std::size_t size) : out_(out) {
    out_.resize(size);
    at_ = out_.data();
  }

  void u8(unsigned char v) { *at_++ = v; }
  void u32(std::uint32_t v) { put(v); }
  void u64(std::uint64_t v) { put(v); }
  void bytes(std::string_view s) {
    u32(static_cast<std::uint32_t>(s.size()));
    if (!s.empty()) std::memcpy(at_, s.data(), s.size());
    at_ += s.size();
  }
  void tokens(std::span<const TokenId> tokens) {
    u32(static_cast<std::uint32_t>(tokens.size()));
    if constexpr (std::endian::native == std::endian::little) {
      if (!tokens.empty()) std::memcpy(at_, tokens.data(), tokens.size_bytes());
      at_ += tokens.size_bytes();
    } else {
      for (TokenId t : tokens) u32(static_cast<std::uint32_t>(t));
    }
  }
  std::size_t written() const { return static_cast<std::size_t>(at_ - out_.data()); }

 private:
  template <typename T>
  void put(T v) {
    for (std::size_t i = 0; i < sizeof(T); ++i) *at_++ = static_cast<unsigned char>(v >> (8 * i));
  }

  std::vector<unsigned char>& out_;
  unsigned char* at_ = nullptr;
};

std::size_t encoded_size(std::span<const TokenId> tokens, const BlockKeys& keys) {
  std::size_t size = 16 + 4 + tokens.size_bytes();
  if (keys.lora_id) size += 1 + 8;
  for (const MultimodalPiece& piece : keys.multimodal) size += 1 + 4 + piece.identifier.size() + 8;
  if (keys.cache_salt) size += 1 + 4 + keys.cache_salt->size();
  return size;
}

BlockHash digest(const std::vector<unsigned char>& bytes, std::uint64_t seed) {
  const XXH128_hash_t h = XXH3_128bits_withSeed(bytes.data(), bytes.size(), seed);
  return BlockHash{h.low64, h.high64};
}

BlockHash hash_into(std::vector<unsigned char>& buffer, const BlockHash& parent,
                    std::span<const TokenId> tokens, const BlockKeys& keys, std::uint64_t seed) {
  ByteWriter w(buffer, encoded_size(tokens, keys));
  w.u64(parent.lo);
  w.u64(parent.hi);
  w.tokens(tokens);
  if (keys.lora_id) {
    w.u8('L');
    w.u64(static_cast<std::uint64_t>(*keys.lora_id));
  }
  for (const MultimodalPiece& piece : keys.multimodal) {
    w.u8('M');
    w.bytes(piece.identifier);
    w.u64(static_cast<std::uint64_t>(piece.offset));
  }
  if (keys.cache_salt) {
    w.u8('S');
    w.bytes(*keys.cache_salt);
  }
  if (w.written() != buffer.size()) throw_internal("block hash encoding size mismatch");
  return digest(buffer, seed);
}

BlockHash make_root(std::uint64_t seed) {
  // A fixed tag hashed with the seed: the chain's start differs per seed, like the blocks after it.
  static constexpr std::string_view kTag = "mixkv.block_hash.root.v1";
  const XXH128_hash_t h = XXH3_128bits_withSeed(kTag.data(), kTag.size(), seed);
  return BlockHash{h.low64, h.high64};
}

void validate(const SequenceKeys& keys) {
  for (std::size_t i = 0; i < keys.multimodal.size(); ++i) {
    const MultimodalItem& item = keys.multimodal[i];
    if (item.length < 1 || item.offset < 0) {
      throw_invalid(fmt::format(
          "multimodal item {} ('{}') has offset {} and length {}: an item needs offset >= 0 and at "
          "least one placeholder token",
          i, item.identifier, item.offset, item.length));
    }
    if (i > 0 && item.offset < keys.multimodal[i - 1].offset) {
      throw_invalid(
          fmt::format("multimodal item {} ('{}') starts at token {}, before item {} at {}: sort "
                      "items by offset",
                      i, item.identifier, item.offset, i - 1, keys.multimodal[i - 1].offset));
    }
  }
}

}  // namespace

std::string to_string(const BlockHash& hash) {
  return fmt::format("{:016x}{:016x}", hash.hi, hash.lo);
}

BlockHasher::BlockHasher(std::int32_t block_size, std::uint64_t seed)
    : block_size_(block_size), seed_(seed), root_(make_root(seed)) {
  if (block_size < 1) {
    throw_invalid(
        fmt::format("block hashing needs a block size of at least 1 token, got {}", block_size));
  }
}

BlockHash BlockHasher::hash_block(const BlockHash& parent, std::span<const TokenId> tokens,
                                  const BlockKeys& keys) {
  return hash_into(buffer_, parent, tokens, keys, seed_);
}

void BlockHasher::extend(std::span<const TokenId> tokens, const SequenceKeys& keys,
                         std::vector<BlockHash>& hashes) {
  const std::size_t bs = static_cast<std::size_t>(block_size_);
  const std::size_t full = tokens.size() / bs;
  if (hashes.size() >= full) return;
  validate(keys);
  hashes.reserve(full);

  const auto& items = keys.multimodal;
  std::size_t first_item = 0;  // items before it end before the current block
  for (std::size_t b = hashes.size(); b < full; ++b) {
    const auto start = static_cast<std::int64_t>(b * bs);
    const auto end = start + static_cast<std::int64_t>(bs);
    while (first_item < items.size() &&
           items[first_item].offset + items[first_item].length <= start) {
      ++first_item;
    }
    pieces_.clear();
    for (std::size_t i = first_item; i < items.size() && items[i].offset < end; ++i) {
      if (items[i].offset + items[i].length > start) {
        pieces_.push_back({items[i].identifier, items[i].offset - start});
      }
    }
    BlockKeys block_keys;
    block_keys.lora_id = keys.lora_id;
    block_keys.multimodal = pieces_;
    if (b == 0 && keys.cache_salt) block_keys.cache_salt = *keys.cache_salt;
    const BlockHash parent = b == 0 ? root_ : hashes.back();
    hashes.push_back(hash_block(parent, tokens.subspan(b * bs, bs), block_keys));
  }
}

BlockHash hash_block(const BlockHash& parent, std::span<const TokenId> tokens,
                     const BlockKeys& keys, std::uint64_t seed) {
  std::vector<unsigned char> buffer;
  return hash_into(buffer, parent, tokens, keys, seed);
}

std::vector<BlockHash> hash_blocks(std::span<const TokenId> tokens, std::int32_t block_size,
                                   const SequenceKeys& keys, std::uint64_t seed) {
  BlockHasher hasher(block_size, seed);
  std::vector<BlockHash> hashes;
  hasher.extend(tokens, keys, hashes);
  return hashes;
}

}  // namespace mixkv::cache
