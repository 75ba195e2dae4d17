// Chained block hashes: deterministic for a seed, and different whenever anything that changes a
// block's KV changes (its parent, its tokens, LoRA, multimodal items, salt, seed).
#include <gtest/gtest.h>

#include <numeric>
#include <unordered_set>
#include <vector>

#include "mixkv/cache/block_hash.hpp"
#include "mixkv/core/error.hpp"

namespace mixkv::cache {
namespace {

constexpr std::uint64_t kSeed = 1234;

std::vector<TokenId> iota_tokens(std::size_t n, TokenId first = 100) {
  std::vector<TokenId> tokens(n);
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

BlockHash hash16(const BlockHash& parent, const BlockKeys& keys = {}, std::uint64_t seed = kSeed) {
  const auto tokens = iota_tokens(16);
  return hash_block(parent, tokens, keys, seed);
}

TEST(BlockHash, SameInputsGiveTheSameHashInEveryHasher) {
  const auto tokens = iota_tokens(100);
  SequenceKeys keys;
  keys.lora_id = 7;
  keys.multimodal = {{"img-a", 20, 30}};
  keys.cache_salt = "tenant";
  EXPECT_EQ(hash_blocks(tokens, 16, keys, kSeed), hash_blocks(tokens, 16, keys, kSeed));
  BlockHasher a(16, kSeed);
  BlockHasher b(16, kSeed);
  EXPECT_EQ(a.root(), b.root());
}

// Pins the byte encoding: hashes are exchanged between processes (P/D instances, restarts), so a
// change here is a format change and must be deliberate.
TEST(BlockHash, KnownBlockHashesToAFixedValue) {
  BlockHasher hasher(4, 0);
  const std::vector<TokenId> tokens = {1, 2, 3, 4};
  EXPECT_EQ(to_string(hasher.hash_block(hasher.root(), tokens, {})),
            "923ca9c98320d28b905a11dc3e800a96");
}

TEST(BlockHash, ToStringGivesThirtyTwoHexDigitsHighHalfFirst) {
  EXPECT_EQ(to_string(BlockHash{0x1, 0xab}), "00000000000000ab0000000000000001");
}

TEST(BlockHash, ParentChangesTheHash) {
  BlockHasher hasher(16, kSeed);
  EXPECT_NE(hash16(hasher.root()), hash16(BlockHash{1, 2}));
  EXPECT_NE(hash16(BlockHash{1, 2}), hash16(BlockHash{2, 1}));
}

TEST(BlockHash, EveryTokenAndItsPositionChangeTheHash) {
  const BlockHash parent{5, 6};
  const auto base = iota_tokens(16);
  std::unordered_set<BlockHash> seen = {hash_block(parent, base, {}, kSeed)};
  for (std::size_t i = 0; i < base.size(); ++i) {
    auto changed = base;
    changed[i] += 1;
    EXPECT_TRUE(seen.insert(hash_block(parent, changed, {}, kSeed)).second) << "token " << i;
  }
  auto swapped = base;
  std::swap(swapped[0], swapped[1]);
  EXPECT_TRUE(seen.insert(hash_block(parent, swapped, {}, kSeed)).second);
  EXPECT_NE(hash_block(parent, std::span(base).first(15), {}, kSeed),
            hash_block(parent, base, {}, kSeed));
}

TEST(BlockHash, LoraIdChangesTheHashAndZeroIsNotAbsent) {
  const BlockHash parent{5, 6};
  BlockKeys none;
  BlockKeys zero;
  zero.lora_id = 0;
  BlockKeys one;
  one.lora_id = 1;
  std::unordered_set<BlockHash> seen = {hash16(parent, none), hash16(parent, zero),
                                        hash16(parent, one)};
  EXPECT_EQ(seen.size(), 3u);
}

TEST(BlockHash, MultimodalIdentifierAndOffsetChangeTheHash) {
  const BlockHash parent{5, 6};
  const MultimodalPiece a0[] = {{"img-a", 0}};
  const MultimodalPiece a3[] = {{"img-a", 3}};
  const MultimodalPiece b0[] = {{"img-b", 0}};
  const MultimodalPiece a0b3[] = {{"img-a", 0}, {"img-b", 3}};
  std::unordered_set<BlockHash> seen = {hash16(parent)};
  for (std::span<const MultimodalPiece> pieces :
       {std::span<const MultimodalPiece>(a0), std::span<const MultimodalPiece>(a3),
        std::span<const MultimodalPiece>(b0), std::span<const MultimodalPiece>(a0b3)}) {
    BlockKeys keys;
    keys.multimodal = pieces;
    EXPECT_TRUE(seen.insert(hash16(parent, keys)).second);
  }
}

TEST(BlockHash, CacheSaltChangesTheHashAndEmptyIsNotAbsent) {
  const BlockHash parent{5, 6};
  BlockKeys empty;
  empty.cache_salt = "";
  BlockKeys salted;
  salted.cache_salt = "tenant-a";
  BlockKeys other;
  other.cache_salt = "tenant-b";
  std::unordered_set<BlockHash> seen = {hash16(parent), hash16(parent, empty),
                                        hash16(parent, salted), hash16(parent, other)};
  EXPECT_EQ(seen.size(), 4u);
}

TEST(BlockHash, KeysOfDifferentKindsDoNotCollide) {
  // A LoRA id and a salt whose bytes could look alike must still hash apart: keys are tagged.
  const BlockHash parent{5, 6};
  BlockKeys lora;
  lora.lora_id = 0x41;
  BlockKeys salt;
  salt.cache_salt = "A";
  EXPECT_NE(hash16(parent, lora), hash16(parent, salt));
}

TEST(BlockHash, SeedChangesTheRootAndEveryBlock) {
  const auto tokens = iota_tokens(64);
  EXPECT_NE(BlockHasher(16, 1).root(), BlockHasher(16, 2).root());
  EXPECT_NE(hash16(BlockHash{5, 6}, {}, 1), hash16(BlockHash{5, 6}, {}, 2));
  const auto one = hash_blocks(tokens, 16, {}, 1);
  const auto two = hash_blocks(tokens, 16, {}, 2);
  for (std::size_t i = 0; i < one.size(); ++i) EXPECT_NE(one[i], two[i]) << "block " << i;
}

TEST(BlockHash, OnlyFullBlocksAreHashed) {
  EXPECT_EQ(hash_blocks(iota_tokens(15), 16, {}, kSeed).size(), 0u);
  EXPECT_EQ(hash_blocks(iota_tokens(16), 16, {}, kSeed).size(), 1u);
  EXPECT_EQ(hash_blocks(iota_tokens(47), 16, {}, kSeed).size(), 2u);
}

TEST(BlockHash, EachBlockChainsOnThePreviousOne) {
  const auto tokens = iota_tokens(48);
  BlockHasher hasher(16, kSeed);
  const auto hashes = hash_blocks(tokens, 16, {}, kSeed);
  ASSERT_EQ(hashes.size(), 3u);
  EXPECT_EQ(hashes[0], hasher.hash_block(hasher.root(), std::span(tokens).subspan(0, 16), {}));
  EXPECT_EQ(hashes[1], hasher.hash_block(hashes[0], std::span(tokens).subspan(16, 16), {}));
  EXPECT_EQ(hashes[2], hasher.hash_block(hashes[1], std::span(tokens).subspan(32, 16), {}));
}

TEST(BlockHash, AChangedTokenChangesItsBlockAndEveryLaterOneOnly) {
  const auto tokens = iota_tokens(64);
  auto changed = tokens;
  changed[40] = -1;  // block 2
  const auto a = hash_blocks(tokens, 16, {}, kSeed);
  const auto b = hash_blocks(changed, 16, {}, kSeed);
  EXPECT_EQ(a[0], b[0]);
  EXPECT_EQ(a[1], b[1]);
  EXPECT_NE(a[2], b[2]);
  EXPECT_NE(a[3], b[3]);
}

TEST(BlockHash, CacheSaltIsHashedIntoTheFirstBlockOnly) {
  const auto tokens = iota_tokens(32);
  SequenceKeys keys;
  keys.cache_salt = "tenant";
  BlockHasher hasher(16, kSeed);
  BlockKeys first;
  first.cache_salt = "tenant";
  const BlockHash h0 = hasher.hash_block(hasher.root(), std::span(tokens).first(16), first);
  const BlockHash h1 = hasher.hash_block(h0, std::span(tokens).subspan(16, 16), {});
  EXPECT_EQ(hash_blocks(tokens, 16, keys, kSeed), (std::vector<BlockHash>{h0, h1}));
}

TEST(BlockHash, LoraIdIsHashedIntoEveryBlock) {
  const auto tokens = iota_tokens(32);
  SequenceKeys keys;
  keys.lora_id = 3;
  BlockHasher hasher(16, kSeed);
  BlockKeys lora;
  lora.lora_id = 3;
  const BlockHash h0 = hasher.hash_block(hasher.root(), std::span(tokens).first(16), lora);
  const BlockHash h1 = hasher.hash_block(h0, std::span(tokens).subspan(16, 16), lora);
  EXPECT_EQ(hash_blocks(tokens, 16, keys, kSeed), (std::vector<BlockHash>{h0, h1}));
}

TEST(BlockHash, MultimodalItemIsHashedIntoEveryBlockItOverlapsWithItsRelativeOffset) {
  const auto tokens = iota_tokens(64);
  SequenceKeys keys;
  keys.multimodal = {{"img", 20, 20}};  // tokens 20..39: blocks 1 and 2
  BlockHasher hasher(16, kSeed);
  const MultimodalPiece in1[] = {{"img", 4}};
  const MultimodalPiece in2[] = {{"img", -12}};
  BlockKeys k1;
  k1.multimodal = in1;
  BlockKeys k2;
  k2.multimodal = in2;
  const BlockHash h0 = hasher.hash_block(hasher.root(), std::span(tokens).subspan(0, 16), {});
  const BlockHash h1 = hasher.hash_block(h0, std::span(tokens).subspan(16, 16), k1);
  const BlockHash h2 = hasher.hash_block(h1, std::span(tokens).subspan(32, 16), k2);
  const BlockHash h3 = hasher.hash_block(h2, std::span(tokens).subspan(48, 16), {});
  EXPECT_EQ(hash_blocks(tokens, 16, keys, kSeed), (std::vector<BlockHash>{h0, h1, h2, h3}));
}

TEST(BlockHash, AnItemEndingAtABlockBoundaryDoesNotReachTheNextBlock) {
  const auto tokens = iota_tokens(32);
  SequenceKeys keys;
  keys.multimodal = {{"img", 0, 16}};
  const auto with = hash_blocks(tokens, 16, keys, kSeed);
  BlockHasher hasher(16, kSeed);
  EXPECT_EQ(with[1], hasher.hash_block(with[0], std::span(tokens).subspan(16, 16), {}));
}

TEST(BlockHash, ExtendingAsTokensArriveEqualsHashingAtOnce) {
  const auto tokens = iota_tokens(200);
  SequenceKeys keys;
  keys.lora_id = 2;
  keys.multimodal = {{"a", 10, 40}, {"b", 90, 5}, {"c", 150, 30}};
  keys.cache_salt = "s";
  BlockHasher hasher(16, kSeed);
  std::vector<BlockHash> hashes;
  for (std::size_t n : {0, 5, 16, 17, 40, 100, 100, 163, 200}) {
    hasher.extend(std::span(tokens).first(n), keys, hashes);
    EXPECT_EQ(hashes.size(), n / 16);
  }
  EXPECT_EQ(hashes, hash_blocks(tokens, 16, keys, kSeed));
}

TEST(BlockHash, BlockSizeBelowOneIsRejected) {
  EXPECT_THROW(BlockHasher(0, kSeed), Error);
  EXPECT_THROW(hash_blocks(iota_tokens(4), -1, {}, kSeed), Error);
}

TEST(BlockHash, MultimodalItemsOutOfOrderOrEmptyAreRejected) {
  const auto tokens = iota_tokens(32);
  SequenceKeys unsorted;
  unsorted.multimodal = {{"a", 10, 2}, {"b", 5, 2}};
  EXPECT_THROW(hash_blocks(tokens, 16, unsorted, kSeed), Error);
  SequenceKeys empty;
  empty.multimodal = {{"a", 10, 0}};
  EXPECT_THROW(hash_blocks(tokens, 16, empty, kSeed), Error);
}

}  // namespace
}  // namespace mixkv::cache
