// mixkv._core: the nanobind extension under the `mixkv` Python package. It binds the planning
// stages (describe, plan, compare) through the CLI's own option resolution, so every option is
// checked with the CLI's message; the run-time KvCacheManager with zero-copy block tables; and
// the CLI itself (cli::run), which `verify`, `generate` and `python -m mixkv` drive in process.
// The value types cross as the JSON documents of docs/plan-json.md and docs/model-file.md;
// python/mixkv/ wraps them. docs/python.md.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <iostream>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cli.hpp"
#include "mixkv/attn/attention_groups.hpp"
#include "mixkv/cache/kv_cache_manager.hpp"
#include "mixkv/core/error.hpp"
#include "mixkv/engine/generator.hpp"
#include "mixkv/engine/tiny_models.hpp"
#include "mixkv/kernels/attention_kernel.hpp"
#include "mixkv/layout/geometry.hpp"
#include "mixkv/layout/geometry_json.hpp"
#include "mixkv/model/describe.hpp"
#include "mixkv/model/model_json.hpp"
#include "mixkv/plan/memory_budget.hpp"
#include "mixkv/plan/plan.hpp"
#include "mixkv/plan/plan_json.hpp"
#include "mixkv/spec/oracle.hpp"
#include "mixkv/tokenizer/chat_template.hpp"
#include "mixkv/weights/gguf_model.hpp"
#include "model_options.hpp"
#include "runner_setup.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace mixkv::python {
namespace {

// ---- Errors ------------------------------------------------------------------------------------
// mixkv::Error's codes become Python classes; a plan that is valid but does not fit its memory
// becomes CapacityError (the C++ library reports it as invalid input: see plan_checked()).
PyObject* g_error = nullptr;
PyObject* g_invalid_input = nullptr;
PyObject* g_capacity_error = nullptr;
PyObject* g_internal_error = nullptr;

struct CapacityFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void translate_error(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const CapacityFailure& e) {
    PyErr_SetString(g_capacity_error, e.what());
  } catch (const Error& e) {
    PyErr_SetString(e.code() == ErrorCode::kInternal ? g_internal_error : g_invalid_input,
                    e.what());
  } catch (const std::bad_alloc&) {
    PyErr_SetString(g_capacity_error, "out of host memory");
  } catch (const nb::python_error&) {
    throw;  // already a Python exception
  } catch (const nb::builtin_exception&) {
    throw;
  } catch (const std::exception& e) {
    PyErr_SetString(g_internal_error, e.what());
  }
}

PyObject* new_error(const char* name, const char* doc, PyObject* bases) {
  PyObject* type = PyErr_NewExceptionWithDoc(name, doc, bases, nullptr);
  if (type == nullptr) throw nb::python_error();
  return type;
}

// Raises InvalidInput naming the argument (an int or a list of them where something else came).
[[noreturn]] void bad_argument(const char* name, const char* expected, nb::handle got) {
  const std::string type_name = nb::type_name(got.type()).c_str();
  throw Error(ErrorCode::kInvalidInput, std::string(name) + " must be " + expected + ", not " +
                                            type_name + "; give " + expected);
}

// A Python int in [lo, hi]; bool is refused (True is not a request id).
std::int64_t as_int(nb::handle h, const char* name, std::int64_t lo, std::int64_t hi) {
  if (!PyLong_Check(h.ptr()) || PyBool_Check(h.ptr())) bad_argument(name, "an int", h);
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(h.ptr(), &overflow);
  if (overflow != 0 || v < lo || v > hi) {
    throw Error(ErrorCode::kInvalidInput, std::string(name) +
                                              " is out of range; give an int from " +
                                              std::to_string(lo) + " to " + std::to_string(hi));
  }
  return v;
}

constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kInt64Min = std::numeric_limits<std::int64_t>::min();
constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();

// More token ids than any request holds (64 MiB of them): an endless iterator is refused, not
// read until memory runs out.
constexpr std::size_t kMaxTokenIds = std::size_t{1} << 24;

[[noreturn]] void too_many_tokens(const char* name) {
  throw Error(ErrorCode::kInvalidInput, std::string(name) + " holds more than " +
                                            std::to_string(kMaxTokenIds) +
                                            " token ids; no request is that long");
}

// Token ids from a list, tuple or 1-D integer NumPy array (anything iterable of ints).
std::vector<cache::TokenId> as_tokens(nb::handle h, const char* name) {
  if (PyUnicode_Check(h.ptr()) || PyBytes_Check(h.ptr()))
    bad_argument(name, "a sequence of ints", h);
  std::vector<cache::TokenId> out;
  if (PyList_Check(h.ptr()) || PyTuple_Check(h.ptr())) {
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(h.ptr());
    if (static_cast<std::size_t>(n) > kMaxTokenIds) too_many_tokens(name);
    PyObject** items = PySequence_Fast_ITEMS(h.ptr());
    out.reserve(static_cast<std::size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) {
      out.push_back(static_cast<cache::TokenId>(
          as_int(items[i], name, 0, std::numeric_limits<cache::TokenId>::max())));
    }
    return out;
  }
  PyObject* iter = PyObject_GetIter(h.ptr());
  if (iter == nullptr) {
    PyErr_Clear();
    bad_argument(name, "a sequence of ints", h);
  }
  nb::object it = nb::steal(iter);
  while (PyObject* item = PyIter_Next(it.ptr())) {
    nb::object o = nb::steal(item);
    if (out.size() == kMaxTokenIds) too_many_tokens(name);
    nb::object index = nb::steal(PyNumber_Index(o.ptr()));  // NumPy integers
    if (!index.is_valid()) {
      PyErr_Clear();
      bad_argument(name, "a sequence of ints", o);
    }
    out.push_back(static_cast<cache::TokenId>(
        as_int(index, name, 0, std::numeric_limits<cache::TokenId>::max())));
  }
  if (PyErr_Occurred()) throw nb::python_error();
  return out;
}

// ---- Planning ----------------------------------------------------------------------------------
// A model reference: a built-in name or path (ref), or a document given as JSON text (a config
// dict from Python), called `name` in messages.
struct ModelRef {
  std::string ref;
  std::optional<std::string> json;
};

// Loads references, with the documents Python handed over as text in place of files.
thread_local const std::vector<std::pair<std::string, std::string>>* t_documents = nullptr;
model::ModelSource load_source(std::string_view ref) {
  if (t_documents != nullptr) {
    for (const auto& [name, text] : *t_documents) {
      if (name == ref) return model::parse_model_source(name, "dict " + name, text);
    }
  }
  return weights::load_model_source(ref);
}

struct DescribeArgs {
  ModelRef model;
  std::optional<ModelRef> draft;
  std::optional<int> tp;
  std::optional<int> num_spec_tokens;
  std::string kv_dtype = "auto";
  std::string draft_kv_dtype;
  std::string ssm_dtype = "auto";
  std::vector<std::string> layer_kv_dtype;
};

// What `mixkv describe` does (cli::describe_from_args), with documents given as text read in
// place of files.
model::ModelDesc describe_impl(const DescribeArgs& a) {
  std::vector<std::pair<std::string, std::string>> documents;
  auto name_of = [&](const ModelRef& r, const char* fallback) {
    if (!r.json) return r.ref;
    std::string name = r.ref.empty() ? fallback : r.ref;
    documents.emplace_back(name, *r.json);
    return name;
  };
  const std::string target = name_of(a.model, "model");
  std::optional<std::string> draft;
  if (a.draft) draft = name_of(*a.draft, "draft");
  if (target.empty()) throw_invalid("model is empty; give a built-in name, a path or a dict");
  cli::ModelArgs cli_args;
  cli_args.tp = a.tp;
  cli_args.num_spec_tokens = a.num_spec_tokens;
  cli_args.kv_dtype = a.kv_dtype;
  cli_args.draft_kv_dtype = a.draft_kv_dtype;
  cli_args.ssm_dtype = a.ssm_dtype;
  cli_args.layer_kv_dtypes = a.layer_kv_dtype;
  const model::DescribeOptions options = cli::describe_options_from_args(cli_args);
  t_documents = &documents;
  struct Reset {
    ~Reset() { t_documents = nullptr; }
  } reset;
  std::optional<std::string_view> draft_ref;
  if (draft && !draft->empty()) draft_ref = *draft;
  return model::describe_refs(target, draft_ref, options, load_source);
}

// A planned cache with the description it was planned from: what KvCacheManager and the JSON
// need.
struct PlanHandle {
  model::ModelDesc desc;
  plan::CachePlan plan;
  std::string memory_note;
};

// `mixkv plan --json`'s document (src/cli/plan_command.cpp): the plan, its attention groups and
// its geometry.
nlohmann::json full_json(const model::ModelDesc& desc, const plan::CachePlan& plan) {
  const auto groups = attn::build_attention_groups(desc, plan);
  nlohmann::json j = plan::to_json(plan);
  j["attention_groups"] = layout::to_json(groups);
  j["geometry"] = layout::to_json(layout::make_geometry(desc, plan, groups));
  return j;
}

plan::CachePlan make_plan_for(const model::ModelDesc& desc, const cli::PlanArgs& args,
                              plan::Policy policy, std::string* note) {
  plan::PlanOptions options = cli::plan_options_from_args(args, desc, note);
  options.policy = policy;
  return plan::make_plan(desc, options);
}

// make_plan_for, with a failure told apart by cause: when the same model and options plan in
// unbounded memory, only the memory was short, and the error becomes CapacityError (same message).
plan::CachePlan plan_checked(const model::ModelDesc& desc, const cli::PlanArgs& args,
                             plan::Policy policy, std::string* note) {
  try {
    return make_plan_for(desc, args, policy, note);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kInternal) throw;
    cli::PlanArgs unbounded = args;
    unbounded.gpu.clear();
    unbounded.memory = "1PiB";
    try {
      (void)make_plan_for(desc, unbounded, policy, nullptr);
    } catch (const Error&) {
      throw e;  // not a matter of memory
    }
    throw CapacityFailure(e.what());
  }
}

cli::PlanArgs plan_args(const std::string& memory, const std::string& gpu, double utilization,
                        std::optional<std::int64_t> block_size, const std::string& backend,
                        std::optional<std::int64_t> max_model_len, std::int64_t request_len,
                        const std::string& policy, std::int64_t max_num_batched_tokens) {
  cli::PlanArgs a;
  if (!memory.empty() && !gpu.empty()) {
    throw_invalid("--memory and --gpu exclude each other; give one (memory='40GiB' or gpu='h100')");
  }
  a.memory = memory;
  a.gpu = gpu;
  a.utilization = utilization;
  a.block_size = block_size;
  a.backend = backend;
  a.max_model_len = max_model_len;
  a.request_len = request_len;
  a.policy = policy;
  a.max_num_batched_tokens = max_num_batched_tokens;
  return a;
}

plan::Policy policy_of(const std::string& text) {
  auto policy = plan::parse_policy(text);
  if (!policy) throw_invalid("--policy '" + text + "' is unknown; use mixkv or vllm");
  return *policy;
}

// ---- The run-time manager ----------------------------------------------------------------------
// cache::KvCacheManager with the geometry of its plan (for slot mappings). Calls keep the GIL:
// the manager is not thread-safe, and the GIL is what serialises Python threads on it.
class Manager {
 public:
  Manager(const PlanHandle& h, int num_spec_tokens, bool prefix_caching, std::uint64_t hash_seed)
      : manager_(h.plan, num_spec_tokens, options(prefix_caching, hash_seed)),
        geometry_(
            layout::make_geometry(h.desc, h.plan, attn::build_attention_groups(h.desc, h.plan))),
        num_groups_(static_cast<int>(h.plan.groups.size())) {}

  cache::KvCacheManager& get() { return manager_; }
  const layout::Geometry& geometry() const { return geometry_; }
  int num_groups() const { return num_groups_; }

  std::span<const cache::BlockId> table(std::int64_t id, nb::handle group) const {
    const auto g = static_cast<int>(as_int(group, "group", 0, num_groups_ - 1));
    return manager_.block_table(cache::RequestId(id), g);
  }

 private:
  static cache::ManagerOptions options(bool prefix_caching, std::uint64_t hash_seed) {
    cache::ManagerOptions o;
    o.enable_prefix_caching = prefix_caching;
    o.hash_seed = hash_seed;
    return o;
  }
  cache::KvCacheManager manager_;
  layout::Geometry geometry_;
  int num_groups_;
};

using Int32View = nb::ndarray<nb::numpy, const std::int32_t, nb::ndim<1>>;
using Int64Array = nb::ndarray<nb::numpy, std::int64_t, nb::ndim<1>>;

// A read-only NumPy view of a block table: the manager's own storage, kept alive by `owner`.
// BlockId is a lone int32_t (standard layout), so the table is an int32 array as it stands.
Int32View table_view(std::span<const cache::BlockId> table, nb::handle owner) {
  static_assert(sizeof(cache::BlockId) == sizeof(std::int32_t));
  static std::int32_t empty = 0;  // a valid address for an empty table
  const void* data = table.empty() ? static_cast<const void*>(&empty) : table.data();
  return Int32View(const_cast<void*>(data), {table.size()}, owner);
}

// A NumPy array that owns `values` (moved, not copied).
Int64Array owned_array(std::vector<std::int64_t> values) {
  auto* heap = new std::vector<std::int64_t>(std::move(values));
  nb::capsule owner(heap,
                    [](void* p) noexcept { delete static_cast<std::vector<std::int64_t>*>(p); });
  return Int64Array(heap->data(), {heap->size()}, owner);
}

nb::dict group_stats(const cache::GroupStats& s) {
  nb::dict d;
  d["group"] = s.group;
  d["behaviour"] = std::string(plan::to_string(s.behaviour));
  d["blocks_held"] = s.blocks_held;
  d["hit_queries"] = s.hit_queries;
  d["hit_tokens"] = s.hit_tokens;
  d["evictions"] = s.evictions;
  d["padding_bytes"] = s.padding_bytes;
  return d;
}

const PlanHandle& plan_handle_of(nb::handle plan) {
  nb::handle h = plan;
  nb::object inner;
  if (!nb::isinstance<PlanHandle>(h)) {
    if (!nb::hasattr(h, "_handle")) bad_argument("plan", "a mixkv.Plan", h);
    inner = h.attr("_handle");
    if (inner.is_none()) {
      throw_invalid(
          "this Plan was built with Plan.from_dict() and holds no cache plan; build it with "
          "mixkv.plan() to run a KvCacheManager over it");
    }
    h = inner;
  }
  if (!nb::isinstance<PlanHandle>(h)) bad_argument("plan", "a mixkv.Plan", plan);
  return nb::cast<const PlanHandle&>(h);
}

// ---- Streaming generation ----------------------------------------------------------------------
// One request generated on its own C++ thread, which never touches Python: the engine's per-step
// callback (GenerateOptions::on_tokens) appends the step's tokens to a queue that the Python
// iterator pops with the GIL released while it waits. The callback then waits while more than
// `buffer` tokens are unread, so the engine runs at most one step plus `buffer` tokens ahead of
// the reader (bounded memory, and a reader can see that tokens come before the run ends). Closing
// the stream (close(), or the object's destruction) makes the next callback throw Cancelled,
// which unwinds the engine; the thread is joined.
struct StreamArgs {
  std::string model;
  std::string draft;  // empty: plain decoding
  int num_spec_tokens = 3;
  std::string prompt;  // used when prompt_ids is empty
  std::vector<engine::TokenId> prompt_ids;
  std::int64_t max_tokens = 32;
  std::uint64_t seed = 0;
  std::string memory = "64MiB";
  std::size_t buffer = 64;
};

class TokenStream {
 public:
  explicit TokenStream(StreamArgs args) : state_(std::make_shared<State>()) {
    state_->buffer = args.buffer;
    worker_ = std::thread([state = state_, args = std::move(args)] { run(*state, args); });
  }
  TokenStream(const TokenStream&) = delete;
  TokenStream& operator=(const TokenStream&) = delete;
  ~TokenStream() { close(); }

  // The next token, or nullopt once the run ended; the engine's error, rethrown here once.
  std::optional<engine::TokenId> next() {
    std::unique_lock lock(state_->mutex);
    state_->changed.wait(lock, [&] { return !state_->queue.empty() || state_->finished; });
    if (!state_->queue.empty()) {
      const engine::TokenId t = state_->queue.front();
      state_->queue.pop_front();
      state_->changed.notify_all();
      return t;
    }
    if (state_->error) std::rethrow_exception(std::exchange(state_->error, nullptr));
    return std::nullopt;
  }

  // Stops the run (at its next step) and waits for its thread; unread tokens are dropped.
  void close() {
    {
      std::lock_guard lock(state_->mutex);
      state_->cancelled = true;
      state_->queue.clear();
    }
    state_->changed.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  std::int64_t generated() const {
    std::lock_guard lock(state_->mutex);
    return state_->generated;
  }
  bool finished() const {
    std::lock_guard lock(state_->mutex);
    return state_->finished;
  }

 private:
  struct Cancelled {};  // not an Error: nothing catches it on the way out of the engine
  struct State {
    mutable std::mutex mutex;
    std::condition_variable changed;
    std::deque<engine::TokenId> queue;
    std::size_t buffer = 0;
    std::int64_t generated = 0;  // tokens the engine committed so far
    bool cancelled = false;
    bool finished = false;
    std::exception_ptr error;
  };

  // Turns MODEL, --draft and the prompt into a runner and a request as `mixkv generate` does
  // (src/cli/generate_command.cpp: a GGUF model's chat template and stop tokens, a tiny model's
  // bytes), so the tokens equal the CLI's; with a drafter, only the speculative run is made.
  static void run(State& st, const StreamArgs& a) {
    try {
      cli::RunnerSetup setup =
          cli::prepare_runner(a.model, a.draft, a.draft.empty() ? 0 : a.num_spec_tokens,
                              plan::parse_memory_size(a.memory));
      runner::ModelRunner runner = setup.make_runner();
      const bool gguf = setup.gguf != nullptr;
      std::vector<std::vector<engine::TokenId>> prompts(1);
      if (!a.prompt_ids.empty()) {
        prompts[0] = a.prompt_ids;
      } else if (gguf) {
        const tokenizer::ChatTemplate& chat =
            tokenizer::chat_template_for(*setup.gguf, std::nullopt);
        const std::vector<tokenizer::ChatMessage> messages{{"user", a.prompt}};
        prompts[0] = setup.tokenizer->encode(chat.render(messages, true),
                                             {.add_special = true, .parse_special = true});
      } else {
        prompts[0] = engine::encode_bytes(a.prompt);
      }
      engine::GenerateOptions go;
      go.max_tokens = a.max_tokens;
      go.sampling.seed = a.seed;
      go.max_batch = 1;
      if (gguf) go.stop_tokens = cli::end_of_generation_ids(*setup.tokenizer);
      std::unique_ptr<spec::Drafter> drafter;
      if (a.draft == "oracle") {
        // The oracle proposes the plain continuation, so the plain run comes first, unstreamed.
        const engine::GenerateReport plain = engine::generate(runner, prompts, nullptr, go);
        std::vector<std::vector<engine::TokenId>> refs{prompts[0]};
        refs[0].insert(refs[0].end(), plain.requests[0].tokens.begin(),
                       plain.requests[0].tokens.end());
        drafter = std::make_unique<spec::OracleDrafter>(std::move(refs));
      } else {
        drafter = cli::make_drafter(a.draft, runner, a.seed);
      }
      if (drafter) go.num_spec_tokens = a.num_spec_tokens;
      go.on_tokens = [&st](std::size_t, std::span<const engine::TokenId> ids) {
        std::unique_lock lock(st.mutex);
        if (st.cancelled) throw Cancelled{};
        st.queue.insert(st.queue.end(), ids.begin(), ids.end());
        st.generated += static_cast<std::int64_t>(ids.size());
        st.changed.notify_all();
        st.changed.wait(lock, [&] { return st.cancelled || st.queue.size() <= st.buffer; });
        if (st.cancelled) throw Cancelled{};
      };
      engine::generate(runner, prompts, drafter.get(), go);
    } catch (const Cancelled&) {
    } catch (...) {
      std::lock_guard lock(st.mutex);
      st.error = std::current_exception();
    }
    {
      std::lock_guard lock(st.mutex);
      st.finished = true;
    }
    st.changed.notify_all();
  }

  std::shared_ptr<State> state_;
  std::thread worker_;
};

// ---- The CLI in process ------------------------------------------------------------------------
std::tuple<int, std::string, std::string> run_cli(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  const int code = cli::run(args, out, err);
  return {code, out.str(), err.str()};
}

int cli_main(const std::vector<std::string>& args) {
  const int code = cli::run(args, std::cout, std::cerr);
  std::cout.flush();
  return code;
}

}  // namespace
}  // namespace mixkv::python

namespace py = mixkv::python;
using mixkv::cache::RequestId;

NB_MODULE(_core, m) {
  m.doc() = "mixkv's C++ library; use the `mixkv` package, which wraps this module.";
#ifdef MIXKV_VERSION
  m.attr("__version__") = MIXKV_VERSION;
#endif

  m.attr("DEFAULT_MAX_NUM_BATCHED_TOKENS") = mixkv::plan::kDefaultMaxNumBatchedTokens;

  nb::object exception = nb::borrow(PyExc_Exception);
  py::g_error =
      py::new_error("mixkv.Error", "Base of every error mixkv raises; the message is the CLI's.",
                    exception.ptr());
  nb::object error = nb::borrow(py::g_error);
  py::g_invalid_input = py::new_error(
      "mixkv.InvalidInput",
      "Bad input: an unknown name, a malformed config, an option out of range, a wrong type "
      "(the CLI's exit status 2).",
      nb::make_tuple(error, nb::borrow(PyExc_ValueError)).ptr());
  py::g_capacity_error = py::new_error(
      "mixkv.CapacityError",
      "Valid input that does not fit: the memory holds no request of the asked length, or the "
      "weights leave no room for the cache.",
      error.ptr());
  py::g_internal_error = py::new_error(
      "mixkv.InternalError", "A broken invariant inside mixkv: a bug (the CLI's exit status 1).",
      nb::make_tuple(error, nb::borrow(PyExc_RuntimeError)).ptr());
  m.attr("Error") = error;
  m.attr("InvalidInput") = nb::borrow(py::g_invalid_input);
  m.attr("CapacityError") = nb::borrow(py::g_capacity_error);
  m.attr("InternalError") = nb::borrow(py::g_internal_error);
  nb::register_exception_translator(py::translate_error);

  // ---- Planning ----
  nb::class_<py::PlanHandle>(m, "PlanHandle",
                             "A cache plan with the model description it was planned from.")
      .def_prop_ro(
          "memory_note", [](const py::PlanHandle& h) { return h.memory_note; },
          "Where the KV memory came from (given, or the GPU's budget).")
      .def(
          "to_json", [](const py::PlanHandle& h) { return py::full_json(h.desc, h.plan).dump(); },
          "The plan as `mixkv plan --json` prints it, as JSON text.")
      .def(
          "model_json",
          [](const py::PlanHandle& h) { return mixkv::model::to_json(h.desc).dump(); },
          "The model description as `mixkv describe --json` prints it.");

  auto ref = [](std::string ref, std::optional<std::string> json) {
    return py::ModelRef{std::move(ref), std::move(json)};
  };
  auto describe_args = [ref](std::string model, std::optional<std::string> model_json,
                             std::optional<std::string> draft,
                             std::optional<std::string> draft_json, std::optional<int> tp,
                             std::optional<int> num_spec_tokens, std::string kv_dtype,
                             std::string draft_kv_dtype, std::string ssm_dtype,
                             std::vector<std::string> layer_kv_dtype) {
    py::DescribeArgs a;
    a.model = ref(std::move(model), std::move(model_json));
    if (draft || draft_json) a.draft = ref(draft.value_or(""), std::move(draft_json));
    a.tp = tp;
    a.num_spec_tokens = num_spec_tokens;
    a.kv_dtype = std::move(kv_dtype);
    a.draft_kv_dtype = std::move(draft_kv_dtype);
    a.ssm_dtype = std::move(ssm_dtype);
    a.layer_kv_dtype = std::move(layer_kv_dtype);
    return a;
  };

  m.def(
      "describe_json",
      [describe_args](std::string model, std::optional<std::string> model_json,
                      std::optional<std::string> draft, std::optional<std::string> draft_json,
                      std::optional<int> tp, std::optional<int> num_spec_tokens,
                      std::string kv_dtype, std::string draft_kv_dtype, std::string ssm_dtype,
                      std::vector<std::string> layer_kv_dtype) {
        const auto desc = py::describe_impl(describe_args(
            std::move(model), std::move(model_json), std::move(draft), std::move(draft_json), tp,
            num_spec_tokens, std::move(kv_dtype), std::move(draft_kv_dtype), std::move(ssm_dtype),
            std::move(layer_kv_dtype)));
        return mixkv::model::to_json(desc).dump();
      },
      "model"_a, "model_json"_a, "draft"_a, "draft_json"_a, "tp"_a, "num_spec_tokens"_a,
      "kv_dtype"_a, "draft_kv_dtype"_a, "ssm_dtype"_a, "layer_kv_dtype"_a,
      nb::call_guard<nb::gil_scoped_release>(),
      "`mixkv describe --json` as JSON text (the GIL is released while it runs).");

  m.def(
      "plan",
      [describe_args](std::string model, std::optional<std::string> model_json,
                      std::optional<std::string> draft, std::optional<std::string> draft_json,
                      std::optional<int> tp, std::optional<int> num_spec_tokens,
                      std::string kv_dtype, std::string draft_kv_dtype, std::string ssm_dtype,
                      std::vector<std::string> layer_kv_dtype, std::string memory, std::string gpu,
                      double utilization, std::optional<std::int64_t> block_size,
                      std::string backend, std::optional<std::int64_t> max_model_len,
                      std::int64_t request_len, std::string policy,
                      std::int64_t max_num_batched_tokens, bool compare) {
        py::PlanHandle h;
        h.desc = py::describe_impl(describe_args(
            std::move(model), std::move(model_json), std::move(draft), std::move(draft_json), tp,
            num_spec_tokens, std::move(kv_dtype), std::move(draft_kv_dtype), std::move(ssm_dtype),
            std::move(layer_kv_dtype)));
        const auto args = py::plan_args(memory, gpu, utilization, block_size, backend,
                                        max_model_len, request_len, policy, max_num_batched_tokens);
        if (!compare) {
          h.plan = py::plan_checked(h.desc, args, py::policy_of(policy), &h.memory_note);
          return std::make_tuple(std::move(h), std::optional<py::PlanHandle>(), std::string());
        }
        // `plan --compare`: vllm may fail where mixkv plans; mixkv's failure is the error.
        (void)py::policy_of(policy);
        py::PlanHandle vllm{h.desc, {}, {}};
        std::string vllm_error;
        std::optional<py::PlanHandle> vllm_plan;
        try {
          vllm.plan =
              py::make_plan_for(h.desc, args, mixkv::plan::Policy::kVllm, &vllm.memory_note);
          vllm_plan = std::move(vllm);
        } catch (const mixkv::Error& e) {
          vllm_error = e.what();
        }
        h.plan = py::plan_checked(h.desc, args, mixkv::plan::Policy::kMixkv, &h.memory_note);
        return std::make_tuple(std::move(h), std::move(vllm_plan), std::move(vllm_error));
      },
      "model"_a, "model_json"_a, "draft"_a, "draft_json"_a, "tp"_a, "num_spec_tokens"_a,
      "kv_dtype"_a, "draft_kv_dtype"_a, "ssm_dtype"_a, "layer_kv_dtype"_a, "memory"_a, "gpu"_a,
      "gpu_memory_utilization"_a, "block_size"_a, "backend"_a, "max_model_len"_a, "request_len"_a,
      "policy"_a, "max_num_batched_tokens"_a, "compare"_a, nb::call_guard<nb::gil_scoped_release>(),
      "Describes and plans as `mixkv plan` does: (plan, vllm plan or None, vllm error); the "
      "last two only with compare. The GIL is released while it runs.");

  // ---- The run-time manager ----
  nb::class_<py::Manager>(
      m, "KvCacheManager",
      "The run-time KV-cache manager (mixkv::cache::KvCacheManager) over a plan's block pool.\n\n"
      "Block tables come back as read-only NumPy int32 views of the manager's own storage: an "
      "entry the manager changes in place (a block leaving a sliding window becomes 0, the null "
      "block) shows at once, but any call that adds blocks (admit, allocate) may move a table; "
      "take a fresh view after it. A view keeps the manager alive; it is not a copy.")
      .def(
          "__init__",
          [](py::Manager* self, nb::handle plan, nb::handle num_spec_tokens, bool prefix_caching,
             nb::handle hash_seed) {
            const py::PlanHandle& h = py::plan_handle_of(plan);
            const auto k = static_cast<int>(py::as_int(num_spec_tokens, "num_spec_tokens", 0, 64));
            const auto seed =
                static_cast<std::uint64_t>(py::as_int(hash_seed, "hash_seed", 0, py::kInt64Max));
            new (self) py::Manager(h, k, prefix_caching, seed);
          },
          nb::sig("def __init__(self, plan: mixkv.Plan, num_spec_tokens: int = 0, prefix_caching: "
                  "bool = True, hash_seed: int = 0) -> None"),
          "plan"_a.none(), "num_spec_tokens"_a.none() = 0, "prefix_caching"_a = true,
          "hash_seed"_a.none() = 0,
          "A manager over `plan` (from mixkv.plan) for `num_spec_tokens` look-ahead tokens.")
      .def(
          "add_request",
          [](py::Manager& self, nb::handle id, nb::handle token_ids) {
            const RequestId rid(py::as_int(id, "id", py::kInt64Min, py::kInt64Max));
            auto tokens = py::as_tokens(token_ids, "token_ids");
            self.get().add_request(rid, std::move(tokens));
          },
          nb::sig("def add_request(self, id: int, token_ids: collections.abc.Sequence[int] | "
                  "numpy.ndarray) -> None"),
          "id"_a.none(), "token_ids"_a.none(), "Registers request `id` with its prompt token ids.")
      .def(
          "find_prefix_hit",
          [](const py::Manager& self, nb::handle id) {
            return const_cast<py::Manager&>(self).get().find_prefix_hit(
                RequestId(py::as_int(id, "id", py::kInt64Min, py::kInt64Max)));
          },
          nb::sig("def find_prefix_hit(self, id: int) -> int"), "id"_a.none(),
          "Prefix tokens every group could serve from the cache now (pure).")
      .def(
          "admit",
          [](py::Manager& self, nb::handle id, nb::handle lookahead) {
            return self.get().admit(RequestId(py::as_int(id, "id", py::kInt64Min, py::kInt64Max)),
                                    static_cast<int>(py::as_int(lookahead, "lookahead", 0, 64)));
          },
          nb::sig("def admit(self, id: int, lookahead: int = 0) -> int | None"), "id"_a.none(),
          "lookahead"_a.none() = 0,
          "Takes the prefix hit and allocates the rest of the prompt plus `lookahead` tokens in "
          "every group or none: the hit length, or None when the blocks do not fit.")
      .def(
          "allocate",
          [](py::Manager& self, nb::handle id, nb::handle num_new, nb::handle lookahead) {
            return self.get().allocate(
                RequestId(py::as_int(id, "id", py::kInt64Min, py::kInt64Max)),
                py::as_int(num_new, "num_new", 0, py::kIntMax),
                static_cast<int>(py::as_int(lookahead, "lookahead", 0, 64)));
          },
          nb::sig("def allocate(self, id: int, num_new: int, lookahead: int = 0) -> bool"),
          "id"_a.none(), "num_new"_a.none(), "lookahead"_a.none() = 0,
          "Room for `num_new` tokens past the verified ones plus `lookahead`, in every group or "
          "none: False (nothing changed) when the pool is too small.")
      .def(
          "commit",
          [](py::Manager& self, nb::handle id, nb::handle newly_computed, nb::handle new_tokens,
             nb::handle accepted_drafts) {
            const RequestId rid(py::as_int(id, "id", py::kInt64Min, py::kInt64Max));
            const auto tokens = py::as_tokens(new_tokens, "new_tokens");
            self.get().commit(
                rid, py::as_int(newly_computed, "newly_computed", 0, py::kIntMax), tokens,
                static_cast<int>(py::as_int(accepted_drafts, "accepted_drafts", 0, 64)));
          },
          nb::sig(
              "def commit(self, id: int, newly_computed: int, new_tokens: "
              "collections.abc.Sequence[int] | numpy.ndarray, accepted_drafts: int = 0) -> None"),
          "id"_a.none(), "newly_computed"_a.none(), "new_tokens"_a.none(),
          "accepted_drafts"_a.none() = 0,
          "After a step: `new_tokens` (accepted drafts and the bonus token) join the request and "
          "`newly_computed` more tokens have verified KV; full verified blocks are cached.")
      .def(
          "free",
          [](py::Manager& self, nb::handle id) {
            self.get().free(RequestId(py::as_int(id, "id", py::kInt64Min, py::kInt64Max)));
          },
          nb::sig("def free(self, id: int) -> None"), "id"_a.none(),
          "Returns every block of request `id`.")
      .def(
          "num_computed",
          [](py::Manager& self, nb::handle id) {
            return self.get().num_computed(
                RequestId(py::as_int(id, "id", py::kInt64Min, py::kInt64Max)));
          },
          nb::sig("def num_computed(self, id: int) -> int"), "id"_a.none(),
          "Tokens of request `id` with verified KV in the cache.")
      .def(
          "block_table",
          [](py::Manager& self, nb::handle id, nb::handle group) {
            const auto table =
                self.table(py::as_int(id, "id", py::kInt64Min, py::kInt64Max), group);
            return py::table_view(table, nb::find(&self));
          },
          nb::sig(
              "def block_table(self, id: int, group: int) -> numpy.typing.NDArray[numpy.int32]"),
          "id"_a.none(), "group"_a.none(),
          "Manager block ids of request `id` in KV-cache group `group`: a read-only int32 view of "
          "the manager's storage, no copy (valid until the next admit/allocate/free; 0 is the "
          "null block).")
      .def(
          "_table_address",
          [](py::Manager& self, nb::handle id, nb::handle group) {
            const auto table =
                self.table(py::as_int(id, "id", py::kInt64Min, py::kInt64Max), group);
            return reinterpret_cast<std::uintptr_t>(table.data());
          },
          nb::sig("def _table_address(self, id: int, group: int) -> int"), "id"_a.none(),
          "group"_a.none(), "Address of the manager's block table storage (for tests).")
      .def(
          "slot_mapping",
          [](py::Manager& self, nb::handle id, const std::string& layer, nb::handle first,
             nb::handle count) {
            const std::int64_t rid = py::as_int(id, "id", py::kInt64Min, py::kInt64Max);
            const auto& geometry = self.geometry().layer(layer);
            if (geometry.recurrent) {
              mixkv::throw_invalid("layer " + layer +
                                   " is recurrent: it has no slot mapping, its state sits in the "
                                   "blocks of its block table");
            }
            const auto table = self.table(rid, nb::int_(geometry.kv_cache_group));
            // Checked here, before slot_mapping reserves `count` slots.
            const std::int64_t f = py::as_int(first, "first", 0, py::kInt64Max);
            const std::int64_t n = py::as_int(count, "count", 0, py::kIntMax);
            const auto held = static_cast<std::int64_t>(table.size()) * geometry.block_tokens;
            if (f > held || n > held - f) {
              mixkv::throw_invalid(
                  "positions [" + std::to_string(f) + ", " + std::to_string(f + n) +
                  ") of request " + std::to_string(rid) + " pass its " + std::to_string(held) +
                  " tokens of blocks in layer " + layer + "; allocate() them first");
            }
            std::vector<std::int64_t> blocks(table.size());
            for (std::size_t i = 0; i < table.size(); ++i) blocks[i] = table[i].value();
            return py::owned_array(mixkv::kernels::slot_mapping(geometry, blocks, f, n));
          },
          nb::sig("def slot_mapping(self, id: int, layer: str, first: int, count: int) -> "
                  "numpy.typing.NDArray[numpy.int64]"),
          "id"_a.none(), "layer"_a, "first"_a.none(), "count"_a.none(),
          "Kernel slots (kernel_page * kernel_tokens + offset) of positions [first, first + "
          "count) of request `id` in attention layer `layer`: a new int64 array, moved from the "
          "C++ vector rather than copied.")
      .def(
          "recurrent_step",
          [](py::Manager& self, nb::handle id, nb::handle group) {
            const auto g = static_cast<int>(py::as_int(group, "group", 0, self.num_groups() - 1));
            const auto s = self.get().recurrent_step(
                RequestId(py::as_int(id, "id", py::kInt64Min, py::kInt64Max)), g);
            nb::dict d;
            d["restore_from"] = s.restore_from.value();
            d["snapshot_at"] = s.snapshot_at;
            d["snapshot"] = s.snapshot.value();
            return d;
          },
          nb::sig("def recurrent_step(self, id: int, group: int) -> dict[str, int]"), "id"_a.none(),
          "group"_a.none(),
          "A recurrent group's step: {'restore_from', 'snapshot_at', 'snapshot'} (block 0: none).")
      .def(
          "stats",
          [](py::Manager& self) {
            nb::list out;
            for (const auto& s : self.get().stats()) out.append(py::group_stats(s));
            return out;
          },
          "Per KV-cache group: blocks held, prefix hits, evictions, padding bytes.")
      .def(
          "_decode_steps_in_cpp",
          [](py::Manager& self, const std::vector<std::int64_t>& ids, int steps,
             std::int32_t token) {
            // The benchmark's baseline: the same allocate + commit pairs as a Python loop,
            // without the interpreter (python/bench/bench_manager.py).
            const auto t0 = std::chrono::steady_clock::now();
            const mixkv::cache::TokenId t[1] = {token};
            for (int s = 0; s < steps; ++s) {
              for (const std::int64_t id : ids) {
                if (!self.get().allocate(RequestId(id), 1, 0)) {
                  mixkv::throw_invalid("the pool is full; plan more memory for the benchmark");
                }
                self.get().commit(RequestId(id), 1, t);
              }
            }
            return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          },
          "ids"_a, "steps"_a, "token"_a,
          "Seconds for `steps` decode steps (allocate + commit) of every request in C++ (for the "
          "benchmark).")
      .def(
          "check_invariants", [](py::Manager& self) { return self.get().check_invariants(); },
          "'' when every invariant of the manager and its pool holds, else what broke.")
      .def_prop_ro(
          "num_requests", [](py::Manager& self) { return self.get().num_requests(); },
          "Requests registered and not freed.")
      .def_prop_ro(
          "num_groups", [](py::Manager& self) { return self.num_groups(); },
          "KV-cache groups of the plan.")
      .def_prop_ro(
          "snapshot_interval", [](py::Manager& self) { return self.get().snapshot_interval(); },
          "Tokens between recurrent snapshots (0 without recurrent groups).")
      .def_prop_ro(
          "num_blocks", [](py::Manager& self) { return self.get().pool().num_blocks(); },
          "Blocks of the pool, the null block included.")
      .def_prop_ro(
          "num_free_blocks", [](py::Manager& self) { return self.get().pool().num_free(); },
          "Blocks that can be handed out, cached or not.")
      .def_prop_ro(
          "num_used_blocks", [](py::Manager& self) { return self.get().pool().num_used(); },
          "Blocks referenced by some request.")
      .def_prop_ro(
          "usage", [](py::Manager& self) { return self.get().pool().usage(); },
          "Share of the usable blocks that are referenced, in [0, 1].");

  // ---- Streaming generation ----
  nb::class_<py::TokenStream>(m, "TokenStream",
                              "One request generated on a C++ thread; iterate for its tokens "
                              "as the engine commits them (mixkv.Generator.stream).")
      .def(
          "__init__",
          [](py::TokenStream* self, std::string model, std::string draft, int num_spec_tokens,
             std::string prompt, std::vector<std::int64_t> prompt_ids, std::int64_t max_tokens,
             std::uint64_t seed, std::string memory, std::int64_t buffer) {
            if (buffer < 0 || buffer > (std::int64_t{1} << 20)) {
              mixkv::throw_invalid("buffer " + std::to_string(buffer) +
                                   " is out of range; give an int from 0 to 2^20");
            }
            py::StreamArgs a;
            a.model = std::move(model);
            a.draft = std::move(draft);
            a.num_spec_tokens = num_spec_tokens;
            a.prompt = std::move(prompt);
            for (const std::int64_t t : prompt_ids) {
              if (t < 0 || t > std::numeric_limits<mixkv::engine::TokenId>::max()) {
                mixkv::throw_invalid("prompt_ids (--prompt-ids) holds " + std::to_string(t) +
                                     ", which is no token id");
              }
              a.prompt_ids.push_back(static_cast<mixkv::engine::TokenId>(t));
            }
            a.max_tokens = max_tokens;
            a.seed = seed;
            a.memory = std::move(memory);
            a.buffer = static_cast<std::size_t>(buffer);
            new (self) py::TokenStream(std::move(a));
          },
          "model"_a, "draft"_a, "num_spec_tokens"_a, "prompt"_a, "prompt_ids"_a, "max_tokens"_a,
          "seed"_a, "memory"_a, "buffer"_a)
      .def("__iter__", [](nb::handle self) { return self; })
      .def(
          "__next__",
          [](py::TokenStream& self) {
            std::optional<mixkv::engine::TokenId> t;
            {
              nb::gil_scoped_release release;
              t = self.next();
            }
            if (!t) throw nb::stop_iteration();
            return *t;
          },
          "The next token id (the GIL is released while it waits); the engine's error as a "
          "mixkv.Error subclass.")
      .def("close", &py::TokenStream::close, nb::call_guard<nb::gil_scoped_release>(),
           "Stops the generation at its next step and waits for its thread.")
      .def_prop_ro("generated", &py::TokenStream::generated,
                   "Tokens the engine has committed so far (read or not).")
      .def_prop_ro("finished", &py::TokenStream::finished,
                   "Whether the generation has ended (done, failed or closed).");

  // ---- The CLI ----
  m.def("run_cli", &py::run_cli, "args"_a, nb::call_guard<nb::gil_scoped_release>(),
        "Runs the mixkv command line in process: (exit status, stdout, stderr). The GIL is "
        "released while it runs.");
  m.def("main", &py::cli_main, "args"_a, nb::call_guard<nb::gil_scoped_release>(),
        "Runs the mixkv command line on the process's stdout and stderr; the exit status.");
}
