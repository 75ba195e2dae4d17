#include "mixkv/transfer/transfer_plan.hpp"

#include <algorithm>
#include <cstring>
#include <string_view>

#include <fmt/format.h>
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>
#if defined(__x86_64__) && __has_include(<xxh_x86dispatch.h>)
#include <xxh_x86dispatch.h>
#define MIXKV_XXH3_DISPATCH 1
#endif

#include "mixkv/core/checked_math.hpp"
#include "mixkv/core/error.hpp"

namespace mixkv::transfer {
namespace {

// libxxhash's x86 dispatcher picks the widest vector unit the CPU has (AVX-512 / AVX2) at run
// time; the plain entry point is its SSE2 build. The same hash either way.
void hash_update(XXH3_state_t* state, const std::byte* data, std::size_t length) {
#ifdef MIXKV_XXH3_DISPATCH
  XXH3_64bits_update_dispatch(state, data, length);
#else
  XXH3_64bits_update(state, data, length);
#endif
}

layout::LayerGeometry geometry_of(const LayerLayout& l) {
  layout::LayerGeometry g;
  g.layer = l.name;
  g.kv_cache_group = l.kv_cache_group;
  g.recurrent = l.recurrent;
  g.tensor = l.tensor;
  g.offset = l.offset;
  g.block_tokens = l.block_tokens;
  g.kernel_tokens = l.kernel_tokens;
  g.kernel_pages_per_block = l.kernel_pages_per_block;
  g.kernel_page_stride = l.kernel_page_stride;
  g.k_token_bytes = l.k_token_bytes;
  g.v_token_bytes = l.v_token_bytes;
  g.v_offset = l.v_offset;
  g.kv_layout = l.kv_layout;
  g.num_kv_heads = std::max(1, l.num_kv_heads);
  g.state_bytes = l.state_bytes;
  return g;
}

const std::vector<std::int64_t>& blocks_of(const RequestBlocks& blocks, const LayerLayout& l,
                                           const char* side) {
  if (l.kv_cache_group < 0 || static_cast<std::size_t>(l.kv_cache_group) >= blocks.groups.size()) {
    throw_invalid(fmt::format("layer {}: the {} side's request has no blocks for KV-cache group {}",
                              l.name, side, l.kv_cache_group));
  }
  return blocks.groups[static_cast<std::size_t>(l.kv_cache_group)];
}

// Heads of `l` (on a side of `tp` ranks) that rank `rank` holds: [begin, begin + count).
struct HeadRange {
  int begin = 0;
  int count = 0;
};
HeadRange heads_of_rank(int total, int tp, int rank) {
  return {static_cast<int>(static_cast<std::int64_t>(rank) * total / tp), std::max(1, total / tp)};
}

// The lowest prefill rank holding global head h: the one that sends it, so a replicated head
// (TP > heads, or an MLA latent) is pulled once.
int first_owner(int total, int tp, int head) {
  for (int r = 0; r < tp; ++r) {
    const HeadRange hr = heads_of_rank(total, tp, r);
    if (head >= hr.begin && head < hr.begin + hr.count) return r;
  }
  return -1;
}

// One side of a layer's transfer: where head `head` of the slice sits for token t, and how many
// tokens from t on are contiguous in memory for a piece of `span` heads of the slice.
struct Side {
  layout::LayerGeometry geo;
  const std::vector<std::int64_t>* blocks = nullptr;
  int first_head = 0;  // the slice's first KV head among this side's
  std::int64_t offset(std::int64_t token, int head, bool v) const {
    const layout::TokenLocation loc = layout::locate_token(geo, *blocks, token);  // checked
    constexpr std::string_view kSlice = "a KV-head slice's offset";
    return checked_add(
        v ? loc.v_offset : loc.k_offset,
        checked_mul(first_head + head, v ? geo.v_head_stride() : geo.k_head_stride(), kSlice),
        kSlice);
  }
  // NHD: a token's heads lie side by side, so tokens follow each other when the piece is all of
  // them. HND: a head's tokens lie side by side, so they follow each other for one head.
  std::int64_t contiguous(std::int64_t token, int span) const {
    const bool runs = geo.hnd() ? span == 1 : span == geo.num_kv_heads;
    return runs ? geo.kernel_tokens - (token % geo.block_tokens) % geo.kernel_tokens : 1;
  }
};

void check_blocks(const LayerLayout& l, const std::vector<std::int64_t>& blocks, std::int64_t first,
                  std::int64_t end, const char* side) {
  if (end > static_cast<std::int64_t>(blocks.size()) * l.block_tokens) {
    throw_invalid(fmt::format(
        "layer {}: the {} side's {} blocks of {} tokens do not hold the request's {} tokens",
        l.name, side, blocks.size(), l.block_tokens, end));
  }
  for (std::int64_t b = first / l.block_tokens; first < end && b <= (end - 1) / l.block_tokens;
       ++b) {
    if (blocks[static_cast<std::size_t>(b)] <= 0) {
      throw_invalid(fmt::format(
          "layer {}: the {} side's block {} (tokens {}..{}) is null or negative, but its tokens "
          "are read after the prefill boundary",
          l.name, side, b, b * l.block_tokens, (b + 1) * l.block_tokens - 1));
    }
  }
}

void check_run(const CopyRun& r, const LayoutDescriptor& p, const LayoutDescriptor& d,
               const LayerLayout& l) {
  const auto inside = [](int t, std::int64_t off, std::int64_t len,
                         const std::vector<std::int64_t>& sizes) {
    return t >= 0 && static_cast<std::size_t>(t) < sizes.size() && off >= 0 && len >= 0 &&
           off <= sizes[static_cast<std::size_t>(t)] - len;
  };
  if (!inside(r.src_tensor, r.src_offset, r.length, p.tensor_bytes) ||
      !inside(r.dst_tensor, r.dst_offset, r.length, d.tensor_bytes)) {
    throw_invalid(fmt::format(
        "layer {}: a {}-byte run at prefill tensor {} offset {} -> decode tensor {} offset {} "
        "falls outside a tensor: a block id past the pool",
        l.name, r.length, r.src_tensor, r.src_offset, r.dst_tensor, r.dst_offset));
  }
}

// A recurrent layer's state between sides of different TP sizes: of every state tensor, along
// its split dimension, the part of each segment that the decode rank holds and this prefill rank
// is the first owner of (a replicated segment comes from prefill rank 0), one run per index of
// the dimensions before it (a conv: one per row and segment; an SSM state: one per segment).
// reconcile() checked that both sides split the same whole shapes alike.
void add_sliced_state(const LayoutDescriptor& p, const LayerLayout& pl, std::int64_t src,
                      const LayoutDescriptor& d, const LayerLayout& dl, std::int64_t dst,
                      std::vector<CopyRun>& runs) {
  for (std::size_t i = 0; i < pl.state.size(); ++i) {
    const StateTensorLayout& a = pl.state[i];
    const StateTensorLayout& b = dl.state.at(i);
    const std::int64_t bytes = state_tensor_bytes(a);
    const std::int64_t elements = element_count(a);
    if (a.split_dim < 0 || a.split_dim != b.split_dim || a.segments.size() != b.segments.size() ||
        bytes % elements != 0) {
      throw_invalid(fmt::format(
          "recurrent layer {}: state tensor '{}' cannot be sliced across TP sizes {} and {}",
          pl.name, a.name, p.tp_size, d.tp_size));
    }
    const auto k = static_cast<std::size_t>(a.split_dim);
    std::int64_t outer = 1;
    std::int64_t inner = bytes / elements;
    for (std::size_t j = 0; j < a.shape.size(); ++j) {
      if (j < k) outer *= a.shape[j];
      if (j > k) inner *= a.shape[j];
    }
    std::int64_t a_start = 0;  // the segment's first index along the split dimension, per side
    std::int64_t b_start = 0;
    for (std::size_t s = 0; s < a.segments.size(); ++s) {
      const StateSegment& as = a.segments[s];
      const StateSegment& bs = b.segments[s];
      // Indices of the whole segment each side's rank holds.
      const std::int64_t a_lo = as.replicated ? 0 : p.tp_rank * as.size;
      const std::int64_t b_lo = bs.replicated ? 0 : d.tp_rank * bs.size;
      const std::int64_t lo = std::max(a_lo, b_lo);
      const std::int64_t hi = std::min(a_lo + as.size, b_lo + bs.size);
      if (lo < hi && (!as.replicated || p.tp_rank == 0)) {
        for (std::int64_t o = 0; o < outer; ++o) {
          runs.push_back({pl.tensor, src + (o * a.shape[k] + a_start + lo - a_lo) * inner,
                          dl.tensor, dst + (o * b.shape[k] + b_start + lo - b_lo) * inner,
                          (hi - lo) * inner});
        }
      }
      a_start += as.size;
      b_start += bs.size;
    }
    src += bytes;
    dst += state_tensor_bytes(b);
  }
}

}  // namespace

PullPlan plan_pull(const LayoutDescriptor& prefill, const LayoutDescriptor& decode,
                   const RequestBlocks& prefill_blocks, const RequestBlocks& decode_blocks,
                   const PullSpec& spec) {
  if (spec.num_tokens < 0 || spec.first_token < 0 || spec.first_token > spec.num_tokens) {
    throw_invalid(fmt::format("a transfer of tokens [{}, {}) is not a token range",
                              spec.first_token, spec.num_tokens));
  }
  PullPlan plan;
  for (std::size_t li = 0; li < prefill.layers.size(); ++li) {
    const LayerLayout& pl = prefill.layers[li];
    const LayerLayout* dlp = decode.find_layer(pl.name);
    if (!dlp) throw_invalid(fmt::format("layer {} is missing on the decode side", pl.name));
    const LayerLayout& dl = *dlp;
    const auto& pb = blocks_of(prefill_blocks, pl, "prefill");
    const auto& db = blocks_of(decode_blocks, dl, "decode");
    if (pl.recurrent) {
      if (prefill.tp_size == decode.tp_size && prefill.tp_rank != decode.tp_rank) continue;
      if (pb.empty() || db.empty() || pb[0] <= 0 || db[0] <= 0) {
        throw_invalid(fmt::format("recurrent layer {}: a side has no live state block", pl.name));
      }
      const std::size_t run_begin = plan.runs.size();
      // Block ids are the sides' own to send: their products are checked.
      constexpr std::string_view kState = "a recurrent state's offset";
      const std::int64_t src =
          checked_add(pl.offset, checked_mul(pb[0], pl.kernel_page_stride, kState), kState);
      const std::int64_t dst =
          checked_add(dl.offset, checked_mul(db[0], dl.kernel_page_stride, kState), kState);
      if (prefill.tp_size == decode.tp_size) {
        plan.runs.push_back({pl.tensor, src, dl.tensor, dst, pl.state_bytes});
      } else {
        add_sliced_state(prefill, pl, src, decode, dl, dst, plan.runs);
      }
      // One unit: the state's bytes this pair moves, in the runs' order.
      for (std::size_t i = run_begin; i < plan.runs.size(); ++i) {
        check_run(plan.runs[i], prefill, decode, pl);
        plan.bytes = checked_add(plan.bytes, plan.runs[i].length, "the transfer's bytes");
      }
      if (plan.runs.size() > run_begin) {
        plan.units.push_back({static_cast<int>(li), 0, spec.num_tokens, run_begin, plan.runs.size(),
                              prefill.tp_size == decode.tp_size});
      }
      continue;
    }
    // The decode rank's heads that this prefill rank sends.
    int hb = -1;
    int he = -1;
    for (int h = dl.kv_head_begin; h < dl.kv_head_begin + dl.num_kv_heads; ++h) {
      if (first_owner(pl.total_kv_heads, prefill.tp_size, h) != prefill.tp_rank) continue;
      if (hb < 0) hb = h;
      he = h + 1;
    }
    if (hb < 0) continue;
    const int heads = he - hb;
    const std::int64_t k_head = pl.k_token_bytes / pl.num_kv_heads;
    const std::int64_t v_head = pl.v_token_bytes / pl.num_kv_heads;
    std::int64_t first = spec.first_token;
    if (pl.window) first = std::max(first, spec.num_tokens + 1 - *pl.window);
    if (pl.chunk) first = std::max(first, spec.num_tokens / *pl.chunk * *pl.chunk);
    const std::int64_t end = spec.num_tokens;
    check_blocks(pl, pb, first, end, "prefill");
    check_blocks(dl, db, first, end, "decode");
    Side src{geometry_of(pl), &pb, hb - pl.kv_head_begin};
    Side dst{geometry_of(dl), &db, hb - dl.kv_head_begin};
    // Pieces of `span` heads: the whole slice when both sides are NHD, else one head, since an
    // HND side holds a token's heads apart. They come in the prefill side's own order (token by
    // token for NHD, head by head for HND), so a unit's bytes hash alike whatever the decode
    // side's layout (PrefillAgent hashes whole units against its own plan).
    const bool per_head = src.geo.hnd() || dst.geo.hnd();
    const int span = per_head ? 1 : heads;
    // One checksum unit per prefill kernel page; in it, K then V, run by run.
    for (std::int64_t a = first; a < end;) {
      const std::int64_t b = std::min(
          end, a + src.geo.kernel_tokens - (a % src.geo.block_tokens) % src.geo.kernel_tokens);
      ChecksumUnit unit{static_cast<int>(li), a, b, plan.runs.size(), 0, heads == pl.num_kv_heads};
      for (int part = 0; part < 2; ++part) {
        const bool v = part == 1;
        const std::int64_t piece = checked_mul(span, v ? v_head : k_head, "a copy run's length");
        if (piece == 0) continue;
        // Tokens [t, t + n) of heads [h, h + span): one run.
        const auto emit = [&](std::int64_t t, int h, std::int64_t n) {
          const CopyRun run{pl.tensor, src.offset(t, h, v), dl.tensor, dst.offset(t, h, v),
                            checked_mul(n, piece, "a copy run's length")};
          check_run(run, prefill, decode, pl);
          plan.runs.push_back(run);
          plan.bytes = checked_add(plan.bytes, run.length, "the transfer's bytes");
        };
        // The longest run from token t on that both sides hold contiguously.
        const auto tokens_of = [&](std::int64_t t, int h) {
          const std::int64_t n =
              std::min({b - t, src.contiguous(t, span), dst.contiguous(t, span)});
          emit(t, h, n);
          return n;
        };
        if (src.geo.hnd()) {  // head by head (span is 1)
          for (int h = 0; h < heads; ++h)
            for (std::int64_t t = a; t < b;) t += tokens_of(t, h);
        } else if (per_head) {  // NHD to HND: a token's heads one by one
          for (std::int64_t t = a; t < b; ++t)
            for (int h = 0; h < heads; ++h) emit(t, h, 1);
        } else {
          for (std::int64_t t = a; t < b;) t += tokens_of(t, 0);
        }
      }
      unit.run_end = plan.runs.size();
      plan.units.push_back(unit);
      a = b;
    }
  }
  return plan;
}

std::uint64_t unit_checksum(const PullPlan& plan, std::size_t unit, const TensorSpans& tensors,
                            bool source) {
  const ChecksumUnit& u = plan.units.at(unit);
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  for (std::size_t i = u.run_begin; i < u.run_end; ++i) {
    const CopyRun& r = plan.runs.at(i);
    const int t = source ? r.src_tensor : r.dst_tensor;
    const std::int64_t off = source ? r.src_offset : r.dst_offset;
    const std::span<std::byte> bytes = tensors.at(static_cast<std::size_t>(t));
    if (off < 0 || r.length < 0 || off > static_cast<std::int64_t>(bytes.size()) - r.length) {
      throw_invalid(fmt::format("a checksummed run at tensor {} offset {} is past its {} bytes", t,
                                off, bytes.size()));
    }
    hash_update(&state, bytes.data() + off, static_cast<std::size_t>(r.length));
  }
  return XXH3_64bits_digest(&state);
}

std::vector<std::uint64_t> unit_checksums(const PullPlan& plan, const TensorSpans& tensors,
                                          bool source) {
  std::vector<std::uint64_t> out;
  out.reserve(plan.units.size());
  for (std::size_t u = 0; u < plan.units.size(); ++u)
    out.push_back(unit_checksum(plan, u, tensors, source));
  return out;
}

void apply_locally(const PullPlan& plan, const TensorSpans& prefill, const TensorSpans& decode) {
  for (const auto& r : plan.runs) {
    const auto src = prefill.at(static_cast<std::size_t>(r.src_tensor));
    const auto dst = decode.at(static_cast<std::size_t>(r.dst_tensor));
    if (r.src_offset + r.length > static_cast<std::int64_t>(src.size()) ||
        r.dst_offset + r.length > static_cast<std::int64_t>(dst.size())) {
      throw_invalid("a copy run falls outside the given tensors");
    }
    std::memcpy(dst.data() + r.dst_offset, src.data() + r.src_offset,
                static_cast<std::size_t>(r.length));
  }
}

}  // namespace mixkv::transfer
