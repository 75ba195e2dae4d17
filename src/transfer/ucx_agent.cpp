#include "mixkv/transfer/ucx_agent.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>

#include <fmt/format.h>
#include <ucp/api/ucp.h>

#include "mixkv/core/error.hpp"
#include "mixkv/core/json_int.hpp"

namespace mixkv::transfer {

std::string_view to_string(FailureReason reason) {
  switch (reason) {
    case FailureReason::kNone:
      return "none";
    case FailureReason::kRefused:
      return "refused";
    case FailureReason::kPeerFailed:
      return "peer_failed";
    case FailureReason::kTimeout:
      return "timeout";
    case FailureReason::kChecksumMismatch:
      return "checksum_mismatch";
    case FailureReason::kLeaseExpired:
      return "lease_expired";
    case FailureReason::kUnknownRequest:
      return "unknown_request";
  }
  return "unknown";
}

namespace {

using Clock = std::chrono::steady_clock;
using Words = std::vector<std::int64_t>;

// Active-message ids of the protocol (docs/transfer.md).
enum AmId : unsigned { kFetch = 1, kOffer = 2, kDone = 3, kAck = 4, kHeartbeat = 5 };
enum OfferStatus : std::int64_t { kOfferOk = 0, kOfferUnknown = 1, kOfferBad = 2 };

[[noreturn]] void ucx_fail(const char* what, ucs_status_t status) {
  throw_internal(fmt::format("UCX {} failed: {}", what, ucs_status_string(status)));
}

std::string to_hex(const void* data, std::size_t size) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(size * 2);
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < size; ++i) {
    out += kDigits[p[i] >> 4];
    out += kDigits[p[i] & 15];
  }
  return out;
}

std::vector<unsigned char> from_hex(const std::string& text) {
  if (text.size() % 2 != 0) throw_invalid("KV transfer handshake: odd-length hex string");
  std::vector<unsigned char> out(text.size() / 2);
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw_invalid("KV transfer handshake: bad hex digit");
  };
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<unsigned char>(nibble(text[2 * i]) << 4 | nibble(text[2 * i + 1]));
  return out;
}

void put_blocks(Words& w, const RequestBlocks& b) {
  w.push_back(static_cast<std::int64_t>(b.groups.size()));
  for (const auto& g : b.groups) {
    w.push_back(static_cast<std::int64_t>(g.size()));
    w.insert(w.end(), g.begin(), g.end());
  }
}

// Reads words from a peer's message, refusing anything past its end.
struct Reader {
  const Words& w;
  std::size_t at = 0;
  std::int64_t next() {
    if (at >= w.size()) throw_invalid("KV transfer: a truncated protocol message");
    return w[at++];
  }
  RequestBlocks blocks() {
    RequestBlocks b;
    const std::int64_t n = next();
    if (n < 0 || n > 4096) throw_invalid("KV transfer: a message with a bad group count");
    for (std::int64_t g = 0; g < n; ++g) {
      const std::int64_t c = next();
      if (c < 0 || static_cast<std::size_t>(c) > w.size() - at)
        throw_invalid("KV transfer: a message with a bad block count");
      b.groups.emplace_back(
          w.begin() + static_cast<std::ptrdiff_t>(at),
          w.begin() + static_cast<std::ptrdiff_t>(at + static_cast<std::size_t>(c)));
      at += static_cast<std::size_t>(c);
    }
    return b;
  }
};

// Length-prefixed JSON frames over the bootstrap TCP socket (the handshake only).
void send_frame(int fd, const std::string& text) {
  const std::uint32_t n = htonl(static_cast<std::uint32_t>(text.size()));
  std::string buf(reinterpret_cast<const char*>(&n), 4);
  buf += text;
  std::size_t sent = 0;
  while (sent < buf.size()) {
    const ssize_t k = ::send(fd, buf.data() + sent, buf.size() - sent, MSG_NOSIGNAL);
    if (k <= 0)
      throw_invalid(fmt::format("KV transfer handshake: send failed: {}", std::strerror(errno)));
    sent += static_cast<std::size_t>(k);
  }
}

std::string recv_frame(int fd) {
  auto read_all = [&](char* p, std::size_t n) {
    std::size_t got = 0;
    while (got < n) {
      const ssize_t k = ::recv(fd, p + got, n - got, 0);
      if (k <= 0) {
        throw_invalid(fmt::format("KV transfer handshake: the peer closed or timed out ({})",
                                  k == 0 ? "closed" : std::strerror(errno)));
      }
      got += static_cast<std::size_t>(k);
    }
  };
  std::uint32_t n = 0;
  read_all(reinterpret_cast<char*>(&n), 4);
  n = ntohl(n);
  if (n > (64u << 20)) throw_invalid("KV transfer handshake: a frame over 64 MiB");
  std::string text(n, '\0');
  read_all(text.data(), n);
  return text;
}

void set_timeouts(int fd, std::chrono::milliseconds t) {
  timeval tv{static_cast<time_t>(t.count() / 1000),
             static_cast<suseconds_t>((t.count() % 1000) * 1000)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

struct Peer;

// One UCP context + worker with the KV tensors registered; shared by both roles.
struct Endpoint {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  std::vector<ucp_mem_h> mems;
  std::vector<std::string> rkeys;  // packed, hex
  std::string address;             // the worker's address, hex
  TensorSpans tensors;
  // Messages that arrived, in order (filled by the AM callback during progress).
  std::vector<std::pair<unsigned, Words>> inbox;

  Endpoint(const TensorSpans& spans, const LayoutDescriptor& layout, const std::string& tls,
           bool wakeup) {
    tensors = spans;
    if (tensors.size() != layout.tensor_bytes.size()) {
      throw_invalid(fmt::format("KV transfer: {} tensors given for a layout of {}", tensors.size(),
                                layout.tensor_bytes.size()));
    }
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      if (static_cast<std::int64_t>(tensors[i].size()) != layout.tensor_bytes[i]) {
        throw_invalid(fmt::format("KV transfer: tensor {} has {} bytes, its layout {}", i,
                                  tensors[i].size(), layout.tensor_bytes[i]));
      }
    }
    ucp_config_t* config = nullptr;
    ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
    if (st != UCS_OK) ucx_fail("config_read", st);
    if (!tls.empty()) ucp_config_modify(config, "TLS", tls.c_str());
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    // Wake-ups (an event fd the prefill thread sleeps on) only with peer failure detection:
    // measured with UCX 1.13, shared-memory gets then wait on the target's wake-ups and run at a
    // few percent of their speed, while a thread that naps 50 us keeps them at full speed.
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | (wakeup ? UCP_FEATURE_WAKEUP : 0);
    st = ucp_init(&params, config, &context);
    ucp_config_release(config);
    if (st != UCS_OK) ucx_fail("init", st);
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    st = ucp_worker_create(context, &wp, &worker);
    if (st != UCS_OK) {
      ucp_cleanup(context);
      ucx_fail("worker_create", st);
    }
    ucp_address_t* addr = nullptr;
    std::size_t addr_len = 0;
    st = ucp_worker_get_address(worker, &addr, &addr_len);
    if (st != UCS_OK) {
      release();
      ucx_fail("worker_get_address", st);
    }
    address = to_hex(addr, addr_len);
    ucp_worker_release_address(worker, addr);
    // Registered once for the agent's life: every request's gets use these keys.
    for (const auto& t : tensors) {
      ucp_mem_map_params_t mp{};
      mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
      mp.address = t.data();
      mp.length = std::max<std::size_t>(t.size(), 1);
      ucp_mem_h mem = nullptr;
      st = ucp_mem_map(context, &mp, &mem);
      if (st != UCS_OK) {
        release();
        ucx_fail("mem_map", st);
      }
      mems.push_back(mem);
      void* packed = nullptr;
      std::size_t packed_len = 0;
      st = ucp_rkey_pack(context, mem, &packed, &packed_len);
      if (st != UCS_OK) {
        release();
        ucx_fail("rkey_pack", st);
      }
      rkeys.push_back(to_hex(packed, packed_len));
      ucp_rkey_buffer_release(packed);
    }
    for (unsigned id : {kFetch, kOffer, kDone, kAck, kHeartbeat}) {
      ucp_am_handler_param_t hp{};
      hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
      hp.id = id;
      hp.flags = UCP_AM_FLAG_WHOLE_MSG;
      hp.cb = &Endpoint::on_message;
      hp.arg = new std::pair<Endpoint*, unsigned>(this, id);
      handler_args.emplace_back(static_cast<std::pair<Endpoint*, unsigned>*>(hp.arg));
      st = ucp_worker_set_am_recv_handler(worker, &hp);
      if (st != UCS_OK) {
        release();
        ucx_fail("set_am_recv_handler", st);
      }
    }
  }
  std::vector<std::unique_ptr<std::pair<Endpoint*, unsigned>>> handler_args;

  ~Endpoint() { release(); }
  void release() {
    for (ucp_mem_h m : mems) ucp_mem_unmap(context, m);
    mems.clear();
    if (worker) ucp_worker_destroy(worker);
    worker = nullptr;
    if (context) ucp_cleanup(context);
    context = nullptr;
  }

  static ucs_status_t on_message(void* arg, const void*, std::size_t, void* data,
                                 std::size_t length, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<std::pair<Endpoint*, unsigned>*>(arg);
    // Senders force eager sends (UCP_AM_SEND_FLAG_EAGER): the whole message is here.
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) || length % sizeof(std::int64_t) != 0)
      return UCS_OK;
    Words w(length / sizeof(std::int64_t));
    if (length > 0) std::memcpy(w.data(), data, length);
    self->first->inbox.emplace_back(self->second, std::move(w));
    return UCS_OK;
  }

  // True when UCX did anything.
  bool progress() {
    bool any = false;
    while (ucp_worker_progress(worker) != 0) any = true;
    return any;
  }

  // Waits for a non-blocking request; false if it did not complete by `deadline` (then it is
  // cancelled and still waited for, so no buffer it uses is freed under it).
  bool wait(void* request, Clock::time_point deadline, ucs_status_t* status) {
    if (request == nullptr) {
      *status = UCS_OK;
      return true;
    }
    if (UCS_PTR_IS_ERR(request)) {
      *status = UCS_PTR_STATUS(request);
      return true;
    }
    bool in_time = true;
    while ((*status = ucp_request_check_status(request)) == UCS_INPROGRESS) {
      progress();
      if (Clock::now() > deadline && in_time) {
        in_time = false;
        ucp_request_cancel(worker, request);
      }
    }
    ucp_request_free(request);
    return in_time;
  }
};

// One connected peer: an endpoint to its worker (peer error handling on) and, on the decode
// side, its tensors' addresses and unpacked rkeys.
struct Peer {
  ucp_ep_h ep = nullptr;
  std::atomic<bool> failed{false};
  LayoutDescriptor layout;
  std::vector<std::uint64_t> remote_base;
  std::vector<ucp_rkey_h> rkeys;
  std::string control;  // decode side: the prefill side's AgentOptions::control
  std::int64_t id = 0;  // the prefill side's number for this decode peer

  static void on_error(void* arg, ucp_ep_h, ucs_status_t) {
    static_cast<Peer*>(arg)->failed = true;
  }

  void open(Endpoint& e, const std::string& address_hex, bool peer_errors) {
    const std::vector<unsigned char> addr = from_hex(address_hex);
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                   UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.address = reinterpret_cast<const ucp_address_t*>(addr.data());
    p.err_mode = peer_errors ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    p.err_handler.cb = &Peer::on_error;
    p.err_handler.arg = this;
    const ucs_status_t st = ucp_ep_create(e.worker, &p, &ep);
    if (st != UCS_OK) ucx_fail("ep_create", st);
  }

  void close(Endpoint& e) {
    for (ucp_rkey_h k : rkeys) ucp_rkey_destroy(k);
    rkeys.clear();
    if (!ep) return;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = failed ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    void* req = ucp_ep_close_nbx(ep, &p);
    ucs_status_t st = UCS_OK;
    if (!e.wait(req, Clock::now() + std::chrono::seconds(2), &st) && !failed) {
      // A flush that cannot finish (a peer gone silently): close by force.
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      e.wait(ucp_ep_close_nbx(ep, &p), Clock::now() + std::chrono::seconds(2), &st);
    }
    ep = nullptr;
  }

  // Sends one protocol message and waits for it to leave (bounded).
  bool send(Endpoint& e, unsigned id, const Words& w, Clock::time_point deadline) {
    if (failed) return false;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_EAGER;
    void* req = ucp_am_send_nbx(ep, id, nullptr, 0, w.data(), w.size() * sizeof(std::int64_t), &p);
    ucs_status_t st = UCS_OK;
    const bool in_time = e.wait(req, deadline, &st);
    if (st != UCS_OK && st != UCS_ERR_CANCELED) failed = true;
    return in_time && st == UCS_OK;
  }
};

// The plan's runs in the order of the prefill side's memory, with runs that continue one
// another on both sides joined: the plan orders them by layer and checksum unit, but pages of
// neighbouring layers and units often sit back to back on both sides (equal geometries, blocks
// allocated in order), and one get per joined run moves them at the transport's full speed.
std::vector<CopyRun> coalesce(std::vector<CopyRun> runs) {
  std::sort(runs.begin(), runs.end(), [](const CopyRun& a, const CopyRun& b) {
    return std::tie(a.src_tensor, a.src_offset) < std::tie(b.src_tensor, b.src_offset);
  });
  std::vector<CopyRun> out;
  for (const CopyRun& r : runs) {
    if (r.length == 0) continue;
    if (!out.empty()) {
      CopyRun& last = out.back();
      if (last.src_tensor == r.src_tensor && last.dst_tensor == r.dst_tensor &&
          last.src_offset + last.length == r.src_offset &&
          last.dst_offset + last.length == r.dst_offset) {
        last.length += r.length;
        continue;
      }
    }
    out.push_back(r);
  }
  return out;
}

// One get: a piece of a joined run, from peer `peer`.
struct Chunk {
  std::size_t peer = 0;
  CopyRun run;
};

// With checksums the joined runs are cut into gets of at most this many bytes, so that a
// checksum unit is verified as soon as the gets holding its bytes have landed: its bytes are
// still in cache, and the later gets run meanwhile (shared-memory gets are copies on the
// threads that progress the two workers; hashing after all of them read every byte again from
// memory).
constexpr std::int64_t kChunkBytes = std::int64_t{1} << 20;

std::vector<Chunk> make_chunks(const std::vector<PullPlan>& plans, bool cut) {
  std::vector<Chunk> out;
  for (std::size_t i = 0; i < plans.size(); ++i) {
    for (CopyRun r : coalesce(plans[i].runs)) {
      while (cut && r.length > kChunkBytes) {
        out.push_back({i, {r.src_tensor, r.src_offset, r.dst_tensor, r.dst_offset, kChunkBytes}});
        r.src_offset += kChunkBytes;
        r.dst_offset += kChunkBytes;
        r.length -= kChunkBytes;
      }
      out.push_back({i, r});
    }
  }
  return out;
}

// Which checksum units wait for which gets: a unit (peer, index) is ready once every chunk that
// writes one of its bytes has landed. Each byte of this side is written by one chunk only.
class LandedUnits {
 public:
  LandedUnits(const std::vector<PullPlan>& plans, const std::vector<Chunk>& chunks)
      : waiters_(chunks.size()) {
    std::vector<std::size_t> order(chunks.size());
    for (std::size_t c = 0; c < order.size(); ++c) order[c] = c;
    const auto start = [&](std::size_t c) {
      return std::pair(chunks[c].run.dst_tensor, chunks[c].run.dst_offset);
    };
    std::sort(order.begin(), order.end(),
              [&](std::size_t a, std::size_t b) { return start(a) < start(b); });
    for (std::size_t i = 0; i < plans.size(); ++i) {
      for (std::size_t u = 0; u < plans[i].units.size(); ++u) {
        const std::size_t id = units_.size();
        units_.push_back({i, u});
        pending_.push_back(0);
        const ChecksumUnit& unit = plans[i].units[u];
        for (std::size_t r = unit.run_begin; r < unit.run_end; ++r) {
          const CopyRun& run = plans[i].runs[r];
          if (run.length == 0) continue;
          // The chunks overlapping [dst_offset, + length): the last starting at or before it,
          // then those starting inside it.
          auto it = std::upper_bound(
              order.begin(), order.end(), std::pair(run.dst_tensor, run.dst_offset),
              [&](const auto& key, std::size_t c) { return key < start(c); });
          if (it != order.begin()) --it;
          for (; it != order.end(); ++it) {
            const CopyRun& c = chunks[*it].run;
            if (c.dst_tensor != run.dst_tensor || c.dst_offset >= run.dst_offset + run.length)
              break;
            if (c.dst_offset + c.length <= run.dst_offset) continue;
            auto& w = waiters_[*it];
            if (!w.empty() && w.back() == id) continue;
            w.push_back(id);
            ++pending_[id];
          }
        }
        if (pending_[id] == 0) ready_.push_back(id);  // moves no byte (cannot happen in a plan)
      }
    }
  }
  void landed(std::size_t chunk) {
    for (std::size_t id : waiters_.at(chunk)) {
      if (--pending_[id] == 0) ready_.push_back(id);
    }
  }
  // The units whose bytes have all landed since the last call: (peer, unit index).
  std::vector<std::pair<std::size_t, std::size_t>> take_ready() {
    std::vector<std::pair<std::size_t, std::size_t>> out;
    for (std::size_t id : ready_) out.push_back(units_[id]);
    ready_.clear();
    return out;
  }

 private:
  std::vector<std::vector<std::size_t>> waiters_;  // chunk -> units
  std::vector<std::pair<std::size_t, std::size_t>> units_;
  std::vector<std::size_t> pending_;
  std::vector<std::size_t> ready_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Prefill side: a thread owns the worker (accepts, answers, watches leases); the public calls
// only touch the mutex-guarded tables.

struct PrefillAgent::Impl {
  LayoutDescriptor layout;
  AgentOptions options;
  std::unique_ptr<Endpoint> endpoint;
  int listen_fd = -1;
  std::uint16_t port = 0;
  std::atomic<bool> stop{false};
  std::thread thread;

  struct Offered {
    RequestBlocks blocks;
    std::int64_t num_tokens = 0;
    int readers = 1;
    int finished = 0;
    bool any_failed = false;
    FailureReason reader_failure = FailureReason::kNone;  // what a failed reader reported
    std::map<std::int64_t, bool> reading;                 // peer -> still reading
    Clock::time_point lease_until;
    // Checksums of the request's whole units (ChecksumUnit::whole) by (layer, first token, end
    // token), computed once by the hashing thread right after the offer, so that a fetch need
    // not hash on the pull's path (`hashed`: all of them). A fetch that comes sooner takes those
    // hashed so far and hashes the rest of its own units; the hashing thread then stops, so a
    // pull that a decode-side prefix hit makes short never waits for the whole request's.
    bool hashed = false;
    bool hash_abandoned = false;  // a fetch came first and hashed the rest itself
    std::map<std::tuple<int, std::int64_t, std::int64_t>, std::uint64_t> sums;
  };
  mutable std::mutex mutex;
  std::map<std::int64_t, Offered> offers;
  std::vector<Release> released;
  // Fetches that came before their offer (the prefill is still running), with their arrival:
  // answered once offered, dropped after a lease (the decode side has timed out by then).
  std::vector<std::pair<Clock::time_point, Words>> waiting_fetches;
  std::map<std::int64_t, std::unique_ptr<Peer>> peers;
  std::int64_t next_peer = 1;
  // Offered requests waiting for the hashing thread (under the mutex).
  std::deque<std::int64_t> to_hash;
  std::condition_variable hash_wake;
  std::thread hasher;

  // The hashing thread: the checksums of every offered request, computed from this side's
  // pages as if this rank were pulled whole (a plan to itself), one request after another.
  void hash_offers() {
    std::unique_lock lock(mutex);
    for (;;) {
      hash_wake.wait(lock, [&] { return stop || !to_hash.empty(); });
      if (stop) return;
      const std::int64_t request = to_hash.front();
      to_hash.pop_front();
      auto it = offers.find(request);
      if (it == offers.end()) continue;
      const RequestBlocks blocks = it->second.blocks;
      const std::int64_t num_tokens = it->second.num_tokens;
      lock.unlock();
      std::map<std::tuple<int, std::int64_t, std::int64_t>, std::uint64_t> sums;
      // Hands what is hashed to the offer, every 64 units; false once the offer is gone or a
      // fetch took over (see answer_fetch).
      const auto publish = [&] {
        std::lock_guard relock(mutex);
        const auto at = offers.find(request);
        if (at == offers.end() || at->second.hash_abandoned) return false;
        at->second.sums.merge(sums);
        sums.clear();
        return true;
      };
      bool going = true;
      try {
        const PullPlan self = plan_pull(layout, layout, blocks, blocks, {num_tokens, 0});
        for (std::size_t u = 0; u < self.units.size() && going; ++u) {
          const ChecksumUnit& unit = self.units[u];
          if (!unit.whole) continue;
          sums[{unit.layer, unit.first_token, unit.end_token}] =
              unit_checksum(self, u, endpoint->tensors, true);
          if (sums.size() >= 64) going = publish();
        }
      } catch (const Error&) {
        // Blocks that do not hold the tokens: every fetch of it is refused by its own plan.
      }
      if (going) going = publish();
      lock.lock();
      it = offers.find(request);
      if (!going || it == offers.end()) continue;
      it->second.hashed = true;
    }
  }

  // Sleeps in poll() on the worker's event fd and the listening socket (UCX wakes it for any
  // incoming message or remote access it must serve), at most 5 ms, so leases are watched. A
  // wake-up that brings no work (shared-memory transports signal their fd for traffic this
  // worker does not serve) is followed by a 50 us nap, so this thread never spins.
  void run() {
    int efd = -1;
    const bool wakeup =
        options.peer_failure_detection && ucp_worker_get_efd(endpoint->worker, &efd) == UCS_OK;
    bool woken = false;
    // New peers and leases are looked at every millisecond, not at every turn: while a pull runs
    // this loop turns for every batch of fragments it serves, and a poll() on the listening
    // socket each time was a system call per turn.
    auto next_watch = Clock::now();
    while (!stop) {
      const bool worked = endpoint->progress() || !endpoint->inbox.empty();
      handle_messages();
      if (const auto now = Clock::now(); now >= next_watch) {
        accept_peers();
        watch();
        next_watch = now + std::chrono::milliseconds(1);
      }
      if (worked) {
        woken = false;
        continue;
      }
      if (!wakeup || woken) {
        woken = false;
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        continue;
      }
      if (ucp_worker_arm(endpoint->worker) == UCS_ERR_BUSY) continue;  // events pending
      pollfd fds[2] = {{efd, POLLIN, 0}, {listen_fd, POLLIN, 0}};
      woken = ::poll(fds, 2, 5) > 0;
    }
  }

  void accept_peers() {
    pollfd pfd{listen_fd, POLLIN, 0};
    if (::poll(&pfd, 1, 0) <= 0) return;
    const int fd = ::accept(listen_fd, nullptr, nullptr);
    if (fd < 0) return;
    set_timeouts(fd, std::chrono::milliseconds(5000));
    try {
      const nlohmann::json hello = nlohmann::json::parse(recv_frame(fd));
      auto peer = std::make_unique<Peer>();
      peer->layout = descriptor_from_json(hello.at("layout"));
      try {
        reconcile(layout, peer->layout);
      } catch (const Error& e) {
        send_frame(fd, nlohmann::json{{"error", e.what()}}.dump());
        ::close(fd);
        return;
      }
      peer->id = next_peer++;
      peer->open(*endpoint, hello.at("address").get<std::string>(), options.peer_failure_detection);
      nlohmann::json reply{{"layout", to_json(layout)},
                           {"address", endpoint->address},
                           {"peer", peer->id},
                           {"rkeys", endpoint->rkeys},
                           {"control", options.control}};
      reply["bases"] = nlohmann::json::array();
      for (const auto& t : endpoint->tensors)
        reply["bases"].push_back(reinterpret_cast<std::uintptr_t>(t.data()));
      send_frame(fd, reply.dump());
      std::lock_guard lock(mutex);
      peers[peer->id] = std::move(peer);
    } catch (const std::exception&) {
      // A peer that breaks off its handshake is dropped; the decode side sees the error.
    }
    ::close(fd);
  }

  Peer* peer_of(std::int64_t id) {
    auto it = peers.find(id);
    return it == peers.end() ? nullptr : it->second.get();
  }

  void handle_messages() {
    std::vector<std::pair<unsigned, Words>> inbox;
    inbox.swap(endpoint->inbox);
    std::vector<std::pair<Clock::time_point, Words>> waiting;
    {
      std::lock_guard lock(mutex);
      waiting.swap(waiting_fetches);
    }
    for (auto& [since, w] : waiting) {
      if (Clock::now() - since > options.lease) continue;
      try {
        Reader r{w};
        const std::int64_t request = r.next();
        Peer* peer = peer_of(r.next());
        if (peer && !answer_fetch(request, *peer, r)) {
          std::lock_guard lock(mutex);
          waiting_fetches.emplace_back(since, std::move(w));
        }
      } catch (const Error&) {
      }
    }
    for (auto& [id, w] : inbox) {
      try {
        Reader r{w};
        const std::int64_t request = r.next();
        const std::int64_t peer_id = r.next();
        Peer* peer = peer_of(peer_id);
        if (!peer) continue;
        if (id == kFetch) {
          if (!answer_fetch(request, *peer, r)) {
            std::lock_guard lock(mutex);
            waiting_fetches.emplace_back(Clock::now(), std::move(w));
          }
        } else if (id == kHeartbeat) {
          std::lock_guard lock(mutex);
          auto it = offers.find(request);
          if (it != offers.end()) it->second.lease_until = Clock::now() + options.lease;
        } else if (id == kDone) {
          const std::int64_t tag = r.next();
          const std::int64_t why = r.next();
          const bool ok = why == 0;
          bool held = false;
          {
            std::lock_guard lock(mutex);
            auto it = offers.find(request);
            held = it != offers.end() && it->second.reading.count(peer_id) &&
                   it->second.reading[peer_id];
            if (held) {
              it->second.reading[peer_id] = false;
              if (!ok && it->second.reader_failure == FailureReason::kNone && why > 0 &&
                  why <= static_cast<std::int64_t>(FailureReason::kUnknownRequest))
                it->second.reader_failure = static_cast<FailureReason>(why);
              it->second.any_failed |= !ok;
            }
          }
          // The acknowledgement leaves before the release is visible: an owner that frees the
          // blocks (or exits) on the release must not cut it off.
          peer->send(*endpoint, kAck, Words{request, tag, held ? 1 : 0},
                     Clock::now() + std::chrono::seconds(1));
          if (held) {
            std::lock_guard lock(mutex);
            auto it = offers.find(request);
            if (it != offers.end()) finish_reader(it);
          }
        }
      } catch (const Error&) {
        // A malformed message from a peer is dropped; its pull times out.
      }
    }
  }

  // Under the mutex.
  void finish_reader(std::map<std::int64_t, Offered>::iterator it) {
    if (++it->second.finished < it->second.readers) return;
    const Offered& o = it->second;
    released.push_back({it->first, !o.any_failed ? FailureReason::kNone
                                   : o.reader_failure != FailureReason::kNone
                                       ? o.reader_failure
                                       : FailureReason::kPeerFailed});
    offers.erase(it);
  }

  // False when the request is not offered yet.
  bool answer_fetch(std::int64_t request, Peer& peer, Reader& r) {
    const std::int64_t tag = r.next();
    const std::int64_t num_tokens = r.next();
    const std::int64_t first_token = r.next();
    const RequestBlocks dst = r.blocks();
    Words reply{request, tag, kOfferOk};
    {
      std::lock_guard lock(mutex);
      auto it = offers.find(request);
      if (it == offers.end()) {
        return false;
      }
      Offered& o = it->second;
      if (options.checksums && !o.hashed) o.hash_abandoned = true;
      std::vector<std::uint64_t> sums;
      try {
        if (num_tokens > o.num_tokens) {
          throw_invalid(fmt::format("request {}: {} tokens asked, {} offered", request, num_tokens,
                                    o.num_tokens));
        }
        const PullPlan plan =
            plan_pull(layout, peer.layout, o.blocks, dst, {num_tokens, first_token});
        if (options.checksums) {
          // Whole units were hashed at the offer; others (a page that the decode side's prefix
          // hit cuts, a TP slice) are hashed here.
          sums.reserve(plan.units.size());
          for (std::size_t u = 0; u < plan.units.size(); ++u) {
            const ChecksumUnit& unit = plan.units[u];
            const auto known = unit.whole
                                   ? o.sums.find({unit.layer, unit.first_token, unit.end_token})
                                   : o.sums.end();
            sums.push_back(known != o.sums.end() ? known->second
                                                 : unit_checksum(plan, u, endpoint->tensors, true));
          }
        }
        put_blocks(reply, o.blocks);
        reply.push_back(static_cast<std::int64_t>(sums.size()));
        for (std::uint64_t s : sums) reply.push_back(static_cast<std::int64_t>(s));
        o.reading[peer.id] = true;
        o.lease_until = Clock::now() + options.lease;
      } catch (const Error&) {
        reply = {request, tag, kOfferBad};
      }
    }
    peer.send(*endpoint, kOffer, reply, Clock::now() + std::chrono::seconds(2));
    return true;
  }

  void watch() {
    std::lock_guard lock(mutex);
    const auto now = Clock::now();
    for (auto it = offers.begin(); it != offers.end();) {
      Offered& o = it->second;
      bool dead_reader = false;
      for (auto& [pid, reading] : o.reading) {
        Peer* p = peer_of(pid);
        if (reading && (!p || p->failed)) {
          reading = false;
          dead_reader = true;
          o.any_failed = true;
          ++o.finished;
        }
      }
      if (now > o.lease_until) {
        released.push_back({it->first, FailureReason::kLeaseExpired});
        it = offers.erase(it);
      } else if (dead_reader && o.finished >= o.readers) {
        released.push_back({it->first, FailureReason::kPeerFailed});
        it = offers.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = peers.begin(); it != peers.end();) {
      if (it->second->failed) {
        it->second->close(*endpoint);
        it = peers.erase(it);
      } else {
        ++it;
      }
    }
  }
};

PrefillAgent::PrefillAgent(LayoutDescriptor layout, TensorSpans tensors, AgentOptions options,
                           const std::string& host, std::uint16_t port)
    : impl_(std::make_unique<Impl>()) {
  impl_->layout = std::move(layout);
  impl_->options = std::move(options);
  impl_->endpoint = std::make_unique<Endpoint>(tensors, impl_->layout, impl_->options.transports,
                                               impl_->options.peer_failure_detection);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw_internal(fmt::format("socket: {}", std::strerror(errno)));
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    ::close(fd);
    throw_invalid(fmt::format("--kv-host '{}' is not an IPv4 address", host));
  }
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 16) != 0) {
    const int err = errno;
    ::close(fd);
    throw_invalid(fmt::format("cannot listen on {}:{}: {}", host, port, std::strerror(err)));
  }
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  impl_->listen_fd = fd;
  impl_->port = ntohs(a.sin_port);
  impl_->thread = std::thread([this] { impl_->run(); });
  impl_->hasher = std::thread([this] { impl_->hash_offers(); });
}

PrefillAgent::~PrefillAgent() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stop = true;
  }
  impl_->hash_wake.notify_all();
  impl_->hasher.join();
  impl_->thread.join();
  for (auto& [id, p] : impl_->peers) p->close(*impl_->endpoint);
  impl_->peers.clear();
  ::close(impl_->listen_fd);
}

std::uint16_t PrefillAgent::port() const { return impl_->port; }

void PrefillAgent::offer(std::int64_t request, RequestBlocks blocks, std::int64_t num_tokens,
                         int readers) {
  if (readers < 1) throw_invalid("an offered request needs at least one reader");
  std::lock_guard lock(impl_->mutex);
  if (impl_->offers.count(request))
    throw_invalid(fmt::format("request {} is already offered", request));
  Impl::Offered o;
  o.blocks = std::move(blocks);
  o.num_tokens = num_tokens;
  o.readers = readers;
  o.lease_until = Clock::now() + impl_->options.lease;
  o.hashed = !impl_->options.checksums;
  impl_->offers.emplace(request, std::move(o));
  if (impl_->options.checksums) {
    impl_->to_hash.push_back(request);
    impl_->hash_wake.notify_one();
  }
}

bool PrefillAgent::offer_ready(std::int64_t request) const {
  std::lock_guard lock(impl_->mutex);
  const auto it = impl_->offers.find(request);
  return it != impl_->offers.end() && it->second.hashed;
}

std::vector<Release> PrefillAgent::take_released() {
  std::lock_guard lock(impl_->mutex);
  std::vector<Release> out;
  out.swap(impl_->released);
  return out;
}

std::size_t PrefillAgent::num_pinned() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->offers.size();
}

std::size_t PrefillAgent::num_peers() const {
  std::lock_guard lock(impl_->mutex);
  std::size_t n = 0;
  for (const auto& [id, p] : impl_->peers) n += p->failed ? 0 : 1;
  return n;
}

// ---------------------------------------------------------------------------------------------
// Decode side: driven by the caller's thread.

struct DecodeAgent::Impl {
  LayoutDescriptor layout;
  AgentOptions options;
  std::unique_ptr<Endpoint> endpoint;
  std::vector<std::unique_ptr<Peer>> peers;

  struct Gets {
    std::int64_t outstanding = 0;
    bool error = false;
    std::vector<std::size_t> landed;  // chunks whose get completed, not yet looked at
  };
  struct GetSlot {
    Gets* gets = nullptr;
    std::size_t chunk = 0;
  };
  static void on_get(void* request, ucs_status_t status, void* user) {
    auto* slot = static_cast<GetSlot*>(user);
    --slot->gets->outstanding;
    if (status != UCS_OK) {
      slot->gets->error = true;
    } else {
      slot->gets->landed.push_back(slot->chunk);
    }
    ucp_request_free(request);
  }
};

DecodeAgent::DecodeAgent(LayoutDescriptor layout, TensorSpans tensors, AgentOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->layout = std::move(layout);
  impl_->options = std::move(options);
  impl_->endpoint = std::make_unique<Endpoint>(tensors, impl_->layout, impl_->options.transports,
                                               impl_->options.peer_failure_detection);
}

DecodeAgent::~DecodeAgent() {
  for (auto& p : impl_->peers) p->close(*impl_->endpoint);
  impl_->peers.clear();
}

std::size_t DecodeAgent::num_peers() const { return impl_->peers.size(); }

const std::string& DecodeAgent::control(std::size_t i) const { return impl_->peers.at(i)->control; }

void DecodeAgent::connect(const std::string& host, std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw_internal(fmt::format("socket: {}", std::strerror(errno)));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  set_timeouts(fd, std::chrono::milliseconds(5000));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1)
    throw_invalid(fmt::format("--kv-peer host '{}' is not an IPv4 address", host));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    throw_invalid(fmt::format("cannot reach the prefill side at {}:{}: {}", host, port,
                              std::strerror(errno)));
  }
  send_frame(
      fd, nlohmann::json{{"layout", to_json(impl_->layout)}, {"address", impl_->endpoint->address}}
              .dump());
  nlohmann::json reply;
  try {
    reply = nlohmann::json::parse(recv_frame(fd));
  } catch (const nlohmann::json::exception&) {
    throw_invalid("KV transfer handshake: the prefill side sent malformed JSON");
  }
  // The reply's fields, read exactly: a reply that lacks one or gives another type (a float for
  // an address, a string for the id) is the prefill side's fault, an Error, not a JSON exception
  // or a value converted without a word.
  const auto field = [&](const char* key) -> const nlohmann::json& {
    if (!reply.is_object() || !reply.contains(key)) {
      throw_invalid(
          fmt::format("KV transfer handshake: the prefill side's reply has no '{}'", key));
    }
    return reply.at(key);
  };
  const auto malformed = [](const char* key) {
    throw_invalid(fmt::format("KV transfer handshake: the prefill side's '{}' is malformed", key));
  };
  if (reply.is_object() && reply.contains("error")) {
    const nlohmann::json& error = reply.at("error");
    throw_invalid(error.is_string() ? error.get<std::string>() : error.dump());
  }
  auto peer = std::make_unique<Peer>();
  peer->layout = descriptor_from_json(field("layout"));
  reconcile(peer->layout, impl_->layout);
  std::vector<std::string> rkeys;
  if (!field("rkeys").is_array()) malformed("rkeys");
  for (const nlohmann::json& k : field("rkeys")) {
    if (!k.is_string()) malformed("rkeys");
    rkeys.push_back(k.get<std::string>());
  }
  if (!field("bases").is_array()) malformed("bases");
  for (const nlohmann::json& b : field("bases")) {
    if (!b.is_number_unsigned()) malformed("bases");  // an address: a non-negative integer
    peer->remote_base.push_back(b.get<std::uint64_t>());
  }
  if (rkeys.size() != peer->layout.tensor_bytes.size() || peer->remote_base.size() != rkeys.size())
    throw_invalid("KV transfer handshake: rkeys do not match the prefill side's tensors");
  const std::optional<std::int64_t> id = json_int64(field("peer"));
  if (!id) malformed("peer");
  peer->id = *id;
  if (reply.contains("control") && reply.at("control").is_string()) {
    peer->control = reply.at("control").get<std::string>();
  }
  if (!field("address").is_string()) malformed("address");
  peer->open(*impl_->endpoint, field("address").get<std::string>(),
             impl_->options.peer_failure_detection);
  for (const auto& hex : rkeys) {
    const std::vector<unsigned char> buf = from_hex(hex);
    ucp_rkey_h k = nullptr;
    const ucs_status_t st = ucp_ep_rkey_unpack(peer->ep, buf.data(), &k);
    if (st != UCS_OK) {
      peer->close(*impl_->endpoint);
      ucx_fail("ep_rkey_unpack", st);
    }
    peer->rkeys.push_back(k);
  }
  impl_->peers.push_back(std::move(peer));
}

PullResult DecodeAgent::pull(std::int64_t request, const RequestBlocks& blocks,
                             const PullSpec& spec) {
  Impl& m = *impl_;
  Endpoint& e = *m.endpoint;
  PullResult result;
  const auto start = Clock::now();
  const auto deadline = start + m.options.timeout;
  const std::size_t n = m.peers.size();
  // Best effort: tell every peer the request is over, so it frees the blocks now rather than
  // at the lease's end; then drop peers that failed.
  auto fail = [&](FailureReason reason, std::string message) {
    for (std::size_t i = 0; i < n; ++i) {
      m.peers[i]->send(e, kDone,
                       Words{request, m.peers[i]->id, static_cast<std::int64_t>(i),
                             static_cast<std::int64_t>(reason)},
                       Clock::now() + std::chrono::milliseconds(200));
    }
    for (auto it = m.peers.begin(); it != m.peers.end();) {
      if ((*it)->failed) {
        (*it)->close(e);
        it = m.peers.erase(it);
      } else {
        ++it;
      }
    }
    result.reason = reason;
    result.message = std::move(message);
    result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return result;
  };
  if (n == 0) return fail(FailureReason::kRefused, "no prefill peer is connected");
  e.inbox.clear();
  for (std::size_t i = 0; i < n; ++i) {
    Words w{request, m.peers[i]->id, static_cast<std::int64_t>(i), spec.num_tokens,
            spec.first_token};
    put_blocks(w, blocks);
    if (!m.peers[i]->send(e, kFetch, w, deadline))
      return fail(FailureReason::kPeerFailed, "the prefill side is unreachable");
  }
  // Waits until `want(i)` holds an answer of type `id` from every peer; false on failure.
  auto collect = [&](unsigned want_id, std::vector<std::optional<Words>>& got,
                     FailureReason* reason, std::string* why) {
    std::size_t have = 0;
    while (have < n) {
      e.progress();
      for (auto& [id, w] : e.inbox) {
        if (id != want_id || w.size() < 3 || w[0] != request || w[1] < 0 ||
            static_cast<std::size_t>(w[1]) >= n || got[static_cast<std::size_t>(w[1])])
          continue;
        got[static_cast<std::size_t>(w[1])] = std::move(w);
        ++have;
      }
      e.inbox.clear();
      for (const auto& p : m.peers) {
        if (p->failed) {
          *reason = FailureReason::kPeerFailed;
          *why = "the prefill side failed (UCX peer error) during the transfer";
          return false;
        }
      }
      if (Clock::now() > deadline) {
        *reason = FailureReason::kTimeout;
        *why =
            fmt::format("no answer from the prefill side within {} ms", m.options.timeout.count());
        return false;
      }
    }
    return true;
  };
  FailureReason reason = FailureReason::kNone;
  std::string why;
  std::vector<std::optional<Words>> offers(n);
  if (!collect(kOffer, offers, &reason, &why)) return fail(reason, why);
  result.offer_seconds = std::chrono::duration<double>(Clock::now() - start).count();

  std::vector<PullPlan> plans(n);
  std::vector<std::vector<std::uint64_t>> sums(n);
  try {
    for (std::size_t i = 0; i < n; ++i) {
      Reader r{*offers[i], 2};
      const std::int64_t status = r.next();
      if (status == kOfferUnknown)
        return fail(FailureReason::kUnknownRequest,
                    fmt::format("request {} is not offered", request));
      if (status != kOfferOk) {
        return fail(FailureReason::kRefused,
                    fmt::format("the prefill side refused request {}: its blocks or token count "
                                "do not match this side's",
                                request));
      }
      const RequestBlocks src = r.blocks();
      const std::int64_t count = r.next();
      for (std::int64_t k = 0; k < count; ++k)
        sums[i].push_back(static_cast<std::uint64_t>(r.next()));
      plans[i] = plan_pull(m.peers[i]->layout, m.layout, src, blocks, spec);
      if (m.options.checksums && sums[i].size() != plans[i].units.size())
        return fail(FailureReason::kRefused, "the offer's checksums do not match the pull plan");
      result.bytes += plans[i].bytes;
      result.runs += static_cast<std::int64_t>(plans[i].runs.size());
    }
  } catch (const Error& err) {
    return fail(FailureReason::kRefused, err.what());
  }
  if (m.options.after_offer) m.options.after_offer();

  // The gets: every run of every peer's plan, a bounded number in flight, heartbeats between;
  // with checksums, each unit verified as soon as its bytes have landed.
  const auto gets_start = Clock::now();
  Impl::Gets gets;
  const std::vector<Chunk> chunks = make_chunks(plans, m.options.checksums);
  std::vector<Impl::GetSlot> slots(chunks.size());
  std::optional<LandedUnits> units;
  if (m.options.checksums) units.emplace(plans, chunks);
  std::string mismatch;
  double hashing = 0;
  // Hashes the units whose gets have all landed; the first mismatch stops the gets.
  auto verify_landed = [&] {
    if (!units) return;
    for (std::size_t c : gets.landed) units->landed(c);
    gets.landed.clear();
    const auto ready = units->take_ready();
    if (ready.empty() || !mismatch.empty()) return;
    const auto t0 = Clock::now();
    for (const auto& [i, u] : ready) {
      const std::uint64_t got = unit_checksum(plans[i], u, e.tensors, false);
      if (got == sums[i][u]) continue;
      const ChecksumUnit& unit = plans[i].units[u];
      mismatch = fmt::format(
          "layer {} tokens [{}, {}): the page's checksum {:016x} is not the {:016x} the prefill "
          "side sent",
          m.layout.layers.at(static_cast<std::size_t>(unit.layer)).name, unit.first_token,
          unit.end_token, got, sums[i][u]);
      break;
    }
    hashing += std::chrono::duration<double>(Clock::now() - t0).count();
  };
  constexpr std::int64_t kMaxInFlight = 512;
  auto next_beat = Clock::now();
  auto beat = [&] {
    if (Clock::now() < next_beat) return;
    for (auto& p : m.peers) p->send(e, kHeartbeat, Words{request, p->id}, deadline);
    next_beat = Clock::now() + m.options.heartbeat;
  };
  auto any_failed = [&] {
    for (const auto& p : m.peers) {
      if (p->failed) return true;
    }
    return false;
  };
  auto progress = [&] {
    e.progress();
    verify_landed();
    beat();
  };
  bool broken = false;
  for (std::size_t c = 0; c < chunks.size() && mismatch.empty(); ++c) {
    Peer& p = *m.peers[chunks[c].peer];
    const CopyRun& run = chunks[c].run;
    while (gets.outstanding >= kMaxInFlight && !any_failed() && Clock::now() <= deadline)
      progress();
    if (gets.error || any_failed() || Clock::now() > deadline) {
      broken = true;
      break;
    }
    slots[c] = {&gets, c};
    ucp_request_param_t prm{};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    prm.cb.send = &Impl::on_get;
    prm.user_data = &slots[c];
    std::byte* dst = e.tensors[static_cast<std::size_t>(run.dst_tensor)].data() + run.dst_offset;
    const std::uint64_t remote = p.remote_base[static_cast<std::size_t>(run.src_tensor)] +
                                 static_cast<std::uint64_t>(run.src_offset);
    void* req = ucp_get_nbx(p.ep, dst, static_cast<std::size_t>(run.length), remote,
                            p.rkeys[static_cast<std::size_t>(run.src_tensor)], &prm);
    if (UCS_PTR_IS_ERR(req)) {
      gets.error = true;
      broken = true;
      break;
    }
    if (req != nullptr) {
      ++gets.outstanding;
    } else {
      gets.landed.push_back(c);  // completed at once
    }
    ++result.gets;
    verify_landed();
    beat();
  }
  while (gets.outstanding > 0 && !any_failed() && Clock::now() <= deadline) progress();
  if (gets.outstanding > 0) {
    // A dead or late peer: close it by force, which completes (cancels) its gets, so none is
    // left writing into this side's pages once pull() returns.
    for (auto& p : m.peers) {
      p->failed = true;
      p->close(e);
    }
    while (gets.outstanding > 0) e.progress();
    const bool late = Clock::now() > deadline;
    return fail(late ? FailureReason::kTimeout : FailureReason::kPeerFailed,
                late
                    ? fmt::format("the gets did not finish within {} ms", m.options.timeout.count())
                    : std::string("the prefill side failed (UCX peer error) during the gets"));
  }
  if (!mismatch.empty()) return fail(FailureReason::kChecksumMismatch, mismatch);
  if (gets.error || broken || any_failed()) {
    return fail(any_failed() || gets.error ? FailureReason::kPeerFailed : FailureReason::kTimeout,
                "a get failed: the prefill side is gone or the transfer timed out");
  }
  verify_landed();
  if (!mismatch.empty()) return fail(FailureReason::kChecksumMismatch, mismatch);
  result.get_seconds = std::chrono::duration<double>(Clock::now() - gets_start).count();
  result.checksum_seconds = hashing;
  // Done: the prefill side frees the blocks and says whether it still held them all along.
  for (std::size_t i = 0; i < n; ++i) {
    if (!m.peers[i]->send(e, kDone, Words{request, m.peers[i]->id, static_cast<std::int64_t>(i), 0},
                          deadline))
      return fail(FailureReason::kPeerFailed, "the prefill side failed before the completion");
  }
  std::vector<std::optional<Words>> acks(n);
  if (!collect(kAck, acks, &reason, &why)) return fail(reason, why);
  for (std::size_t i = 0; i < n; ++i) {
    if ((*acks[i])[2] == 0) {
      result.reason = FailureReason::kLeaseExpired;
      result.message = fmt::format(
          "the prefill side's lease on request {} expired before the pull finished: its blocks "
          "may have been reused, so the pulled KV is discarded",
          request);
    }
  }
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

}  // namespace mixkv::transfer
