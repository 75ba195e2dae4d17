// Software prefetch of streamed operands (K/V pages, packed weights).
#pragma once

namespace mixkv::kernels::detail {

// Asks for the cache line holding `p` into L2 and the caches beyond it (x86: prefetcht1), ahead
// of the loads that will use it. A request into L1 (prefetcht0, hwy::Prefetch) holds one of the
// core's few L1 miss buffers until its line arrives, so a stream asked for that way is bounded by
// those buffers, not by the memory: on a Zen 4, paged bf16 decode and the one-row q4_1 products
// drew about 1.5x more bytes a second once their prefetches went to L2 (docs/kernels.md, "Prefetch
// into L2"). The loads then find the line in L2, a few cycles away.
inline void prefetch_l2(const void* p) { __builtin_prefetch(p, 0, 2); }

}  // namespace mixkv::kernels::detail
