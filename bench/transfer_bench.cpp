// KV transfer throughput: one request of a hybrid model with a drafter (Qwen3.5-27B + its DFlash
// drafter at TP 4: Gated DeltaNet states, full-attention KV, drafter KV) pulled by a decode agent
// from a prefill agent, over TCP and over shared memory, beside a raw ucp_get_nbx of the same
// number of bytes from one contiguous buffer, in the same run. Checksums on by default; the
// `nosum` variants show their cost. Timed: the pull (fetch, gets, verification, acknowledgement)
// and the prefill side's release; not timed: the offer and the prefill side's hashing after it.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <ucp/api/ucp.h>

#include "mixkv/attn/attention_groups.hpp"
#include "mixkv/layout/geometry.hpp"
#include "mixkv/model/describe.hpp"
#include "mixkv/plan/plan.hpp"
#include "mixkv/transfer/layout_descriptor.hpp"
#include "mixkv/transfer/transfer_plan.hpp"
#include "mixkv/transfer/ucx_agent.hpp"

namespace mixkv::transfer {
namespace {

struct Side {
  LayoutDescriptor descriptor;
  plan::CachePlan plan;
  std::vector<std::vector<std::byte>> storage;
  TensorSpans tensors() {
    TensorSpans out;
    for (auto& s : storage) out.emplace_back(s.data(), s.size());
    return out;
  }
};

Side make_side(std::int64_t tokens) {
  model::DescribeOptions d;
  d.tp = 4;
  const model::ModelDesc desc = model::describe_refs("qwen3.5-27b", "dflash-qwen3.5-27b", d);
  plan::PlanOptions p;
  p.memory_bytes = std::int64_t{5} << 29;  // 2.5 GiB per rank
  p.max_model_len = tokens + 64;
  p.request_len = tokens;
  Side s;
  s.plan = plan::make_plan(desc, p);
  const auto groups = attn::build_attention_groups(desc, s.plan);
  const layout::Geometry geo = layout::make_geometry(desc, s.plan, groups);
  s.descriptor = make_descriptor(desc, s.plan, geo);
  for (const auto& t : geo.tensors)
    s.storage.emplace_back(static_cast<std::size_t>(t.bytes), std::byte{1});
  return s;
}

RequestBlocks blocks_for(const Side& s, std::int64_t tokens) {
  RequestBlocks b;
  std::int64_t next = 1;
  for (const auto& g : s.plan.groups) {
    const std::int64_t n =
        g.behaviour == plan::Behaviour::kRecurrent ? 1 : (tokens + g.block_size - 1) / g.block_size;
    b.groups.emplace_back();
    for (std::int64_t i = 0; i < n; ++i) b.groups.back().push_back(next + i);
    next += n;
  }
  return b;
}

void BM_TransferPull(benchmark::State& state, const char* transports, bool checksums) {
  const std::int64_t tokens = state.range(0);
  Side p = make_side(tokens);
  Side d = make_side(tokens);
  const RequestBlocks pb = blocks_for(p, tokens);
  AgentOptions o;
  o.transports = transports;
  o.peer_failure_detection = std::string(transports).find("posix") == std::string::npos;
  o.checksums = checksums;
  o.timeout = std::chrono::seconds(60);
  o.lease = std::chrono::seconds(60);
  PrefillAgent prefill(p.descriptor, p.tensors(), o);
  DecodeAgent decode(d.descriptor, d.tensors(), o);
  decode.connect("127.0.0.1", prefill.port());
  std::int64_t id = 0;
  std::int64_t bytes = 0;
  double checksum = 0, offer = 0, get = 0, hash = 0;
  double total = 0;
  for (auto _ : state) {
    // Not timed: the offer, and the prefill side hashing its pages once the prefill is over (in
    // serving, while the decode side is told to pull and admits the request); `hash_ms` shows it.
    state.PauseTiming();
    const auto offered = std::chrono::steady_clock::now();
    prefill.offer(++id, pb, tokens);
    while (!prefill.offer_ready(id)) std::this_thread::sleep_for(std::chrono::microseconds(100));
    hash += std::chrono::duration<double>(std::chrono::steady_clock::now() - offered).count();
    state.ResumeTiming();
    const PullResult r = decode.pull(id, pb, {tokens, 0});
    if (!r.ok()) {
      state.SkipWithError(r.message.c_str());
      break;
    }
    while (prefill.take_released().empty()) std::this_thread::yield();
    bytes = r.bytes;
    checksum += r.checksum_seconds;
    offer += r.offer_seconds;
    get += r.get_seconds;
    total += r.seconds;
    state.counters["runs"] = static_cast<double>(r.runs);
    state.counters["gets"] = static_cast<double>(r.gets);
  }
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["MB"] = static_cast<double>(bytes) / 1e6;
  // Where a pull's time goes: the offer (fetch to offer: the prefill side plans and sums), the
  // gets, the decode side's verification; the rest is planning and the acknowledgement.
  state.counters["offer_share"] = total > 0 ? offer / total : 0;
  state.counters["get_share"] = total > 0 ? get / total : 0;
  state.counters["verify_share"] = total > 0 ? checksum / total : 0;
  const double n = static_cast<double>(std::max<benchmark::IterationCount>(state.iterations(), 1));
  state.counters["hash_ms"] = 1e3 * hash / n;
}

// The same bytes in one buffer, one ucp_get_nbx per iteration, between two workers of one
// process (both progressed here), with the same transports.
void BM_RawGet(benchmark::State& state, const char* transports) {
  const std::int64_t tokens = state.range(0);
  Side p = make_side(tokens);
  const PullPlan plan = plan_pull(p.descriptor, p.descriptor, blocks_for(p, tokens),
                                  blocks_for(p, tokens), {tokens, 0});
  const std::size_t n = static_cast<std::size_t>(plan.bytes);
  p.storage.clear();
  std::vector<std::byte> src(n, std::byte{1});
  std::vector<std::byte> dst(n, std::byte{0});
  ucp_config_t* config = nullptr;
  ucp_config_read(nullptr, nullptr, &config);
  ucp_config_modify(config, "TLS", transports);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA;
  ucp_context_h ctx = nullptr;
  ucp_init(&params, config, &ctx);
  ucp_config_release(config);
  ucp_worker_params_t wp{};
  ucp_worker_h a = nullptr;
  ucp_worker_h b = nullptr;
  ucp_worker_create(ctx, &wp, &a);
  ucp_worker_create(ctx, &wp, &b);
  ucp_address_t* addr = nullptr;
  std::size_t len = 0;
  ucp_worker_get_address(b, &addr, &len);
  ucp_ep_params_t ep_params{};
  ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
  ep_params.address = addr;
  ucp_ep_h ep = nullptr;
  ucp_ep_create(a, &ep_params, &ep);
  ucp_worker_release_address(b, addr);
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = src.data();
  mp.length = n;
  ucp_mem_h mem = nullptr;
  ucp_mem_map(ctx, &mp, &mem);
  void* packed = nullptr;
  std::size_t packed_len = 0;
  ucp_rkey_pack(ctx, mem, &packed, &packed_len);
  ucp_rkey_h rkey = nullptr;
  ucp_ep_rkey_unpack(ep, packed, &rkey);
  ucp_rkey_buffer_release(packed);
  for (auto _ : state) {
    ucp_request_param_t prm{};
    void* req =
        ucp_get_nbx(ep, dst.data(), n, reinterpret_cast<std::uint64_t>(src.data()), rkey, &prm);
    if (UCS_PTR_IS_ERR(req)) {
      state.SkipWithError("ucp_get_nbx failed");
      break;
    }
    if (req) {
      while (ucp_request_check_status(req) == UCS_INPROGRESS) {
        ucp_worker_progress(a);
        ucp_worker_progress(b);
      }
      ucp_request_free(req);
    }
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(n));
  state.counters["MB"] = static_cast<double>(n) / 1e6;
  ucp_rkey_destroy(rkey);
  ucp_mem_unmap(ctx, mem);
  ucp_request_param_t cp{};
  cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  cp.flags = UCP_EP_CLOSE_FLAG_FORCE;
  void* creq = ucp_ep_close_nbx(ep, &cp);
  if (creq && !UCS_PTR_IS_ERR(creq)) {
    while (ucp_request_check_status(creq) == UCS_INPROGRESS) ucp_worker_progress(a);
    ucp_request_free(creq);
  }
  ucp_worker_destroy(a);
  ucp_worker_destroy(b);
  ucp_cleanup(ctx);
}

BENCHMARK_CAPTURE(BM_TransferPull, shm, "posix,self", true)
    ->Arg(4096)
    ->Arg(32768)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_TransferPull, shm_nosum, "posix,self", false)
    ->Arg(4096)
    ->Arg(32768)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_RawGet, shm, "posix,self")
    ->Arg(4096)
    ->Arg(32768)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_TransferPull, tcp, "tcp", true)
    ->Arg(4096)
    ->Arg(32768)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_TransferPull, tcp_nosum, "tcp", false)
    ->Arg(4096)
    ->Arg(32768)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_RawGet, tcp, "tcp")
    ->Arg(4096)
    ->Arg(32768)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace mixkv::transfer
