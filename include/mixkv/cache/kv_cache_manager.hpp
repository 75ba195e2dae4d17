// The run-time KV-cache manager: one block pool per plan, a block table per request and
// KV-cache group, prefix caching valid across every group, all-or-nothing slot allocation for
// new and speculative look-ahead tokens, and rollback of rejected draft tokens.
//
// Lifecycle of a request: add_request() registers its prompt; admit() takes the longest prefix
// hit valid for all groups and allocates the rest of the prompt plus look-ahead (all or nothing);
// each step, allocate() makes room for the step's tokens plus look-ahead and commit() records the
// tokens the target verified — only those are ever cached; rejected look-ahead slots stay
// allocated and are overwritten next step. free() returns everything.
//
// Recurrent groups take prefix hits at snapshot boundaries: every `snapshot_interval` tokens (a
// multiple of every attention group's block size) the state is kept in a cached block, and a
// later request restores it instead of recomputing. recurrent_step() tells the runner which state
// to restore and where to write the boundary state; docs/cache.md gives the policy and its cost.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "mixkv/cache/block_hash.hpp"
#include "mixkv/cache/block_pool.hpp"
#include "mixkv/plan/plan.hpp"

namespace mixkv::cache {

class RequestId {
 public:
  constexpr RequestId() = default;
  constexpr explicit RequestId(std::int64_t value) : value_(value) {}
  constexpr std::int64_t value() const { return value_; }
  friend constexpr auto operator<=>(const RequestId&, const RequestId&) = default;

 private:
  std::int64_t value_ = 0;
};

struct ManagerOptions {
  bool enable_prefix_caching = true;
  std::uint64_t hash_seed = 0;
  // Tokens between two recurrent snapshots. 0: the least common multiple of the attention groups'
  // block sizes (kDefaultSnapshotInterval for a model without attention). Else it must be a
  // multiple of every attention group's block size, so a snapshot boundary is a block boundary
  // of every group.
  std::int64_t snapshot_interval = 0;
};
inline constexpr std::int64_t kDefaultSnapshotInterval = 256;

// What the runner does with one recurrent group in the step just admitted or allocated.
struct RecurrentStep {
  // Not null after a prefix hit, until the first commit: copy this cached state (the state after
  // the hit's tokens) into the live state block before computing, then never write to it.
  BlockId restore_from;
  // 0, or a token count P in (computed, computed + new + look-ahead]: copy the state after the
  // first P tokens into `snapshot` (a decode step: the checkpoint of that position; a prefill:
  // the state after the piece ending at P). commit() caches it when P is verified. For hits to be
  // bit-exact the runner splits every prefill at every multiple of snapshot_interval(), not only
  // at P: recurrent kernels round states between calls (docs/cache.md).
  std::int64_t snapshot_at = 0;
  BlockId snapshot;
  bool operator==(const RecurrentStep&) const = default;
};

// What one KV-cache group holds right now; a metrics endpoint can export it as is.
struct GroupStats {
  int group = 0;
  plan::Behaviour behaviour = plan::Behaviour::kAllTokens;
  std::int64_t blocks_held = 0;    // non-null table entries over all requests
  std::int64_t hit_queries = 0;    // admissions that looked for a prefix in this group
  std::int64_t hit_tokens = 0;     // tokens this group could have served from the cache
  std::int64_t evictions = 0;      // cached blocks of this group dropped to be reused
  std::int64_t padding_bytes = 0;  // bytes held but not holding data (page padding)
  bool operator==(const GroupStats&) const = default;
};

class KvCacheManager {
 public:
  KvCacheManager(const plan::CachePlan& plan, int num_spec_tokens, ManagerOptions options = {});

  void add_request(RequestId id, std::vector<TokenId> prompt, SequenceKeys keys = {});

  // Prefix tokens all groups can serve from the cache (a multiple of every group's block size,
  // at most prompt length - 1 so the last prompt token is computed). Pure.
  std::int64_t find_prefix_hit(RequestId id) const;

  // Takes the prefix hit and allocates blocks for the rest of the prompt plus `lookahead`
  // tokens, in every group or none. Returns the hit length, or nullopt when the blocks do not
  // fit (nothing changed).
  std::optional<std::int64_t> admit(RequestId id, int lookahead);

  // Makes room for `num_new` tokens beyond the verified ones plus `lookahead`, in every group or
  // none. Returns false (nothing changed) when the pool is too small.
  [[nodiscard]] bool allocate(RequestId id, std::int64_t num_new, int lookahead);

  // After a step: `new_tokens` (accepted drafts and the sampled bonus token) join the request,
  // and `newly_computed` more of its tokens have verified KV in the cache (a speculative step:
  // the last known token plus the accepted drafts). Full verified blocks are cached, blocks that
  // left every window are freed, and recurrent groups make checkpoint `accepted_drafts` (the
  // state after the last accepted draft) their live state.
  void commit(RequestId id, std::int64_t newly_computed, std::span<const TokenId> new_tokens,
              int accepted_drafts = 0);

  void free(RequestId id);

  std::int64_t num_computed(RequestId id) const;
  // Attention groups: one block per block_size tokens (null where a window dropped it).
  // Recurrent groups: the live state, one checkpoint per speculative token, then the snapshot
  // block while a step that reaches a snapshot boundary is being computed and verified.
  std::span<const BlockId> block_table(RequestId id, int group) const;
  // Throws kInvalidInput for a group that is not recurrent.
  RecurrentStep recurrent_step(RequestId id, int group) const;
  // Tokens between recurrent snapshots (0 without recurrent groups or with prefix caching off).
  std::int64_t snapshot_interval() const { return snapshot_interval_; }
  std::vector<GroupStats> stats() const;
  const BlockPool& pool() const { return pool_; }
  std::size_t num_requests() const { return index_.size(); }

  // "" when every invariant holds, else what broke (tests call it after every operation).
  std::string check_invariants() const;

 private:
  struct Group {
    int id = 0;
    plan::Behaviour behaviour = plan::Behaviour::kAllTokens;
    std::int64_t block_size = 0;  // recurrent: the snapshot interval
    std::int64_t window = 0;      // sliding: tokens a query sees; chunked: chunk size
    std::int64_t padding_per_block = 0;
    int hasher = -1;  // index into hashers_ (attention groups)
    GroupStats stats;
  };
  // Per request and group. The cached-block count sits next to the table, so a step touches one
  // line per group.
  struct GroupState {
    std::vector<BlockId> table;
    std::int64_t num_cached = 0;  // leading blocks in the prefix map (attention groups)
    // Windowed groups: every block before this index is null. A step whose window starts in the
    // same block skips drop_out_of_window (and the cold front of the table) entirely.
    std::int64_t window_start = 0;
    // Recurrent groups: the cached snapshot a hit restores from, held until the first commit.
    BlockId restore;
  };
  // The first cache line holds all a decode step reads besides the vectors' contents.
  // A decode step that fills no block reads and writes the first line only: the thresholds
  // below decide, without touching any group, that no group has work.
  struct alignas(64) Request {
    std::int64_t num_computed = 0;
    std::int64_t hash_at = 0;  // token count at which some hasher has a new full block
    // Tokens every attention table has slots for (the least over attention groups).
    std::int64_t capacity = 0;
    // Computed-token count at or after which some group has work in commit() (a block to cache,
    // a block leaving a window); 0 when every commit has work (recurrent groups swap states).
    std::int64_t next_event = 0;
    std::vector<TokenId> tokens;     // verified tokens: the prompt, then accepted outputs
    std::vector<GroupState> groups;  // per group
    std::vector<std::vector<BlockHash>> hashes;  // per hasher, of full verified blocks
    std::int64_t id = 0;
    bool live = false;  // false: a free slot, waiting in free_slots_
    // Recurrent groups: RecurrentStep::snapshot_at of this step. Off the first line: models
    // without recurrent groups never touch it.
    std::int64_t snapshot_at = 0;
    std::int64_t prompt_len = 0;
    SequenceKeys keys;
  };

  // Request id -> slot in requests_. Open addressing with linear probing over a power-of-two
  // array kept at most half full: a lookup is a multiply and one or two probes of one flat
  // array, where std::unordered_map costs a modulo and a pointer chase to a node per step.
  class SlotIndex {
   public:
    SlotIndex();
    // -1 when absent. Inline: every step starts with it.
    std::int32_t find(std::int64_t id) const {
      const std::size_t mask = entries_.size() - 1;
      for (std::size_t i = home(id);; i = (i + 1) & mask) {
        const Entry& e = entries_[i];
        if (e.slot < 0) return -1;  // the array is never full, so every probe ends
        if (e.id == id) return e.slot;
      }
    }
    void insert(std::int64_t id, std::int32_t slot);  // `id` must be absent
    void erase(std::int64_t id);
    std::size_t size() const { return size_; }

   private:
    struct Entry {
      std::int64_t id = 0;
      std::int32_t slot = -1;  // -1: empty
    };
    std::size_t home(std::int64_t id) const {
      // Fibonacci hashing: the top bits of the product depend on every bit of the id, so
      // sequential ids spread over the array.
      return static_cast<std::size_t>((static_cast<std::uint64_t>(id) * 0x9E3779B97F4A7C15ULL) >>
                                      shift_);
    }
    void grow();
    std::vector<Entry> entries_;
    int shift_ = 0;  // 64 - log2(entries_.size()): home() keeps a product's top bits
    std::size_t size_ = 0;
  };

  // Inline with the index lookup: every step starts here.
  Request& request(RequestId id) {
    const std::int32_t slot = index_.find(id.value());
    if (slot < 0) throw_no_request(id);
    return requests_[static_cast<std::size_t>(slot)];
  }
  const Request& request(RequestId id) const {
    const std::int32_t slot = index_.find(id.value());
    if (slot < 0) throw_no_request(id);
    return requests_[static_cast<std::size_t>(slot)];
  }
  [[noreturn]] static void throw_no_request(RequestId id);
  // The parts of allocate() and commit() that only some steps need, kept out of line so the
  // common step does not pay their register saves.
  [[gnu::noinline]] bool grow(Request& r, std::int64_t num_new, int lookahead);
  [[gnu::noinline]] void commit_groups(Request& r, int accepted_drafts);
  // `snapshot`: the step reaches a snapshot boundary, so recurrent groups want a block for it.
  std::int64_t blocks_wanted(const Group& g, std::int64_t tokens, bool snapshot) const;
  std::int64_t extra_blocks(const Group& g, std::size_t held, std::int64_t tokens,
                            bool snapshot) const;
  std::int64_t first_needed_token(const Group& g, std::int64_t num_computed) const;
  std::int64_t capacity_of(const Request& r) const;
  std::int64_t next_event_of(const Request& r) const;
  [[noreturn]] void throw_over_capacity(const Request& r, std::int64_t computed) const;
  std::int64_t longest_hit(const Group& g, const Request& r, std::int64_t limit) const;
  void update_hashes(Request& r);
  void drop_out_of_window(const Group& g, GroupState& gs, std::int64_t num_computed);
  std::int64_t snapshot_target(std::int64_t computed, std::int64_t num_new,
                               std::int64_t lookahead) const;
  void keep_snapshot(const Group& g, GroupState& gs, const Request& r);

  BlockPool pool_;
  int num_spec_tokens_;
  ManagerOptions options_;
  std::int64_t snapshot_interval_ = 0;  // 0: no recurrent group, or prefix caching off
  bool has_recurrent_ = false;
  std::vector<Group> groups_;
  std::vector<BlockHasher> hashers_;
  // Dense storage: slots of freed requests are reused, so the vector stays as large as the
  // peak number of requests and a step touches no map node.
  std::vector<Request> requests_;
  std::vector<std::int32_t> free_slots_;
  SlotIndex index_;
};

}  // namespace mixkv::cache
