// `mixkv serve MODEL`: the OpenAI-compatible server (mixkv::server) over the reference engine.
// It listens first (so /health says 503 while the model loads), loads the model as `generate`
// does, prints the plan and the URL, and serves until SIGINT or SIGTERM, then drains.
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <optional>
#include <ostream>

#include "cli.hpp"
#include "mixkv/core/error.hpp"
#include "mixkv/engine/tiny_models.hpp"
#include "mixkv/plan/memory_budget.hpp"
#include "mixkv/server/server.hpp"
#include "mixkv/tokenizer/byte_tokenizer.hpp"
#include "mixkv/tokenizer/chat_template.hpp"
#include "mixkv/weights/gguf_model.hpp"
#include "model_options.hpp"
#include "runner_setup.hpp"

namespace mixkv::cli {

Action add_serve_command(CLI::App& app) {
  struct Args {
    std::string model, draft;
    int num_spec_tokens = 3;
    std::string memory = "64MiB";
    std::string gpu;
    double gpu_memory_utilization = 0.9;
    std::uint64_t seed = 0;
    std::string chat_template;
    std::int64_t max_model_len = 0;
    int threads = 0;
    std::int64_t block_size = 16;
    std::string policy = "mixkv";
    std::string weight_order = kDefaultWeightOrder;
    std::string attention_order = "float";
    std::string kv_layout = "NHD";
    std::string kv_dtype = "auto";
    std::string kv_role, kv_load_failure = "recompute";
    double kv_timeout = 10, kv_lease = 5;
    server::ServeOptions serve;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve MODEL over an OpenAI-compatible HTTP API");
  cmd->footer(
      "Endpoints: POST /v1/completions, /v1/chat/completions, /tokenize, /detokenize; GET "
      "/v1/models, /health, /metrics, /openapi.json. Requests without temperature decode "
      "greedily; temperature, top_p, top_k and seed are applied (with a drafter, speculative "
      "sampling keeps the target's distribution). The KV cache gets --memory bytes, or, as "
      "`plan --gpu` budgets it, the GPU's memory times --gpu-memory-utilization minus the "
      "estimated weights (host memory holds it: at most 16 GiB). SIGINT or SIGTERM drains and "
      "exits 0. docs/server.md.");
  cmd->add_option("MODEL", args->model, "Target model (as for generate)")->required();
  cmd->add_option("--draft", args->draft,
                  "Drafter (as for generate, except oracle): ngram, random, mtp, tiny-eagle, "
                  "tiny-dflash or a drafter checkpoint directory");
  CLI::Option* spec_tokens = cmd->add_option("--num-spec-tokens", args->num_spec_tokens,
                                             "Tokens drafted per step (with --draft)")
                                 ->capture_default_str();
  cmd->add_option("--host", args->serve.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", args->serve.port, "Port to listen on (0: any free one)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--max-num-seqs", args->serve.max_num_seqs, "Requests running at once")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{4096}));
  cmd->add_option("--max-queue", args->serve.max_queue,
                  "Requests waiting beyond which new ones get 503 + Retry-After")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{65536}));
  cmd->add_option("--prefill-chunk", args->serve.prefill_chunk,
                  "Prompt tokens one request computes per step")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  CLI::Option* memory = cmd->add_option("--memory", args->memory, "KV-cache bytes (e.g. 64MiB)")
                            ->capture_default_str();
  CLI::Option* gpu = cmd->add_option("--gpu", args->gpu,
                                     "Budget the KV cache as plan does for this GPU: "
                                     "h100|h200|b200|b300 (memory minus estimated weights)")
                         ->excludes(memory);
  cmd->add_option("--gpu-memory-utilization", args->gpu_memory_utilization,
                  "With --gpu: share of the GPU's memory the cache and weights may use")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0))
      ->needs(gpu);
  cmd->add_option("--api-key", args->serve.api_key,
                  "Ask for 'Authorization: Bearer KEY' on /v1/*, /tokenize and /detokenize");
  cmd->add_option("--served-model-name", args->serve.served_model_name,
                  "Model name in /v1/models and requests (default: MODEL)");
  cmd->add_option("--shutdown-timeout", args->serve.shutdown_timeout,
                  "Seconds running requests get to finish after SIGINT/SIGTERM")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  add_seed_option(*cmd, "--seed", args->seed, "Seed of the random drafter");
  cmd->add_option("--chat-template", args->chat_template,
                  "GGUF models: render chats with this template (chatml, smollm2) instead of the "
                  "one the file's tokenizer.chat_template is recognised as");
  cmd->add_option("--max-model-len", args->max_model_len,
                  "Longest request the cache is planned for (default: the model's context, at "
                  "most 2048 for a GGUF model)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 20));
  add_weight_order_option(*cmd, args->weight_order);
  add_attention_order_option(*cmd, args->attention_order);
  add_kv_layout_option(*cmd, args->kv_layout);
  add_kv_dtype_option(*cmd, args->kv_dtype);
  cmd->add_option("--threads", args->threads,
                  "Threads for matrix products and attention (default: one per core, at most 8)")
      ->check(CLI::Range(0, 256));

  cmd->add_option("--block-size", args->block_size, "Attention manager block (tokens)")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 16));
  cmd->add_option("--policy", args->policy, "Planning policy: mixkv or vllm")
      ->capture_default_str()
      ->check(CLI::IsMember({"mixkv", "vllm"}));
  cmd->add_option("--kv-role", args->kv_role,
                  "Prefill/decode disaggregation: prefill (computes prompts for decode servers) "
                  "or decode (takes requests, prefills them on --kv-peer, pulls their KV)")
      ->check(CLI::IsMember({"prefill", "decode"}));
  cmd->add_option("--kv-port", args->serve.kv.port,
                  "--kv-role prefill: port of the KV agent's bootstrap socket (0: any free one), "
                  "on --host")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--kv-peer", args->serve.kv.peer,
                  "--kv-role decode: HOST:PORT of the prefill server's --kv-port (IPv4)");
  cmd->add_option("--kv-load-failure", args->kv_load_failure,
                  "--kv-role decode: when a remote prefill or KV pull fails, recompute the "
                  "prompt here or fail the request with 503")
      ->capture_default_str()
      ->check(CLI::IsMember({"recompute", "fail"}));
  cmd->add_option("--kv-timeout", args->kv_timeout,
                  "--kv-role decode: seconds a remote prefill, and then its pull, may take")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 3600.0));
  cmd->add_option("--kv-lease", args->kv_lease,
                  "--kv-role prefill: seconds a prefilled request's blocks stay pinned without "
                  "a sign of life from its reader")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 3600.0));

  return [args, spec_tokens](std::ostream& out) {
    if (spec_tokens->count() > 0 && args->draft.empty()) {
      throw_invalid(fmt::format(
          "--num-spec-tokens {} needs a drafter: add --draft, or drop --num-spec-tokens",
          args->num_spec_tokens));
    }
    if (!args->draft.empty()) check_num_spec_tokens(args->num_spec_tokens);
    if (args->draft == "oracle") {
      throw_invalid(
          "--draft oracle replays known outputs, which a server does not have; use ngram, a "
          "drafter model or mtp");
    }
    // The budget is checked before the server listens: a bad one is the user's input.
    std::int64_t memory_bytes = 0;
    std::string memory_note;
    if (args->gpu.empty()) {
      memory_bytes = plan::parse_memory_size(args->memory);
    } else {
      const engine::TinyModel* tiny = engine::find_tiny_model(args->model);
      const model::ModelDesc desc =
          tiny != nullptr ? model::describe(engine::tiny_model_source(*tiny), std::nullopt, {})
                          : weights::describe_refs(args->model, std::nullopt, {});
      const plan::MemoryBudget budget =
          plan::budget_for_gpu(plan::find_gpu(args->gpu), args->gpu_memory_utilization, desc);
      plan::check_host_cache_bytes(budget.kv_bytes, fmt::format("--gpu {}'s KV budget", args->gpu),
                                   "--gpu-memory-utilization, or --memory");
      memory_note = "KV memory: " + budget.explanation + "\n";
      memory_bytes = budget.kv_bytes;
    }
    // SIGINT and SIGTERM go to sigwait() below, not to a handler: every thread the server
    // starts inherits this mask.
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);

    server::ServeOptions so = args->serve;
    if (so.served_model_name.empty()) so.served_model_name = args->model;
    so.kv.role = args->kv_role == "prefill"  ? server::KvRole::kPrefill
                 : args->kv_role == "decode" ? server::KvRole::kDecode
                                             : server::KvRole::kNone;
    if ((so.kv.role == server::KvRole::kDecode) != !so.kv.peer.empty()) {
      throw_invalid(so.kv.peer.empty()
                        ? "--kv-role decode needs --kv-peer HOST:PORT (the prefill server's "
                          "--kv-port)"
                        : "--kv-peer is for --kv-role decode");
    }
    so.kv.host = so.host;
    so.kv.fail_on_load_failure = args->kv_load_failure == "fail";
    so.kv.agent.timeout =
        std::chrono::milliseconds(static_cast<std::int64_t>(args->kv_timeout * 1000));
    so.kv.agent.lease = std::chrono::milliseconds(static_cast<std::int64_t>(args->kv_lease * 1000));
    server::Server srv(so);
    srv.start();
    out << fmt::format("mixkv serve: loading {} (GET /health answers 503 until ready)\n",
                       args->model)
        << std::flush;

    const int k = args->draft.empty() ? 0 : args->num_spec_tokens;
    RunnerSetup setup = prepare_runner(args->model, args->draft, k, memory_bytes,
                                       args->max_model_len, args->threads);
    setup.options.block_size = args->block_size;
    setup.options.weight_order = parse_weight_order(args->weight_order);
    setup.options.attention_order =
        kernels::parse_attention_order(args->attention_order, "--attention-order");
    setup.options.kv_layout = attn::parse_kv_layout(args->kv_layout, "--kv-layout");
    setup.options.kv_dtype = dtype_option("--kv-dtype", args->kv_dtype);
    setup.options.policy = args->policy == "vllm" ? plan::Policy::kVllm : plan::Policy::kMixkv;
    runner::ModelRunner runner = setup.make_runner();
    std::unique_ptr<spec::Drafter> drafter = make_drafter(args->draft, runner, args->seed);
    // The vocabulary: a GGUF's own (with its chat template and end-of-turn ids), the tiny
    // models' bytes; a checkpoint directory has none (token-id prompts only).
    std::unique_ptr<tokenizer::Tokenizer> tok = std::move(setup.tokenizer);
    if (!tok && engine::find_tiny_model(args->model) != nullptr) {
      tok = std::make_unique<tokenizer::ByteTokenizer>();
    }
    const tokenizer::ChatTemplate* chat = nullptr;
    if (setup.gguf != nullptr) {
      try {
        chat = &tokenizer::chat_template_for(
            *setup.gguf, args->chat_template.empty()
                             ? std::nullopt
                             : std::optional<std::string_view>(args->chat_template));
      } catch (const Error& e) {
        if (!args->chat_template.empty()) throw;
        out << fmt::format("mixkv serve: no chat completions ({})\n", e.what());
      }
    } else if (!args->chat_template.empty()) {
      throw_invalid(fmt::format("--chat-template is for GGUF models; {} has no tokenizer for it",
                                args->model));
    }
    server::ServedModel served;
    served.runner = &runner;
    served.drafter = drafter.get();
    served.num_spec_tokens = k;
    served.tokenizer = tok.get();
    served.chat_template = chat;
    if (setup.gguf != nullptr) served.stop_tokens = end_of_generation_ids(*tok);
    srv.attach(served);

    const plan::CachePlan& plan = runner.plan();
    out << fmt::format("plan: {} KV-cache group{}, {} blocks in {} MiB, max_model_len {}{}\n",
                       plan.groups.size(), plan.groups.size() == 1 ? "" : "s",
                       plan.pools.empty() ? 0 : plan.pools.front().num_blocks,
                       plan.memory_bytes >> 20, plan.max_model_len,
                       drafter ? fmt::format(", drafter {} (k = {})", drafter->name(), k) : "")
        << memory_note
        << fmt::format("serving {} at http://{}:{} (SIGINT/SIGTERM to stop)\n",
                       so.served_model_name, so.host, srv.port())
        << (so.kv.role == server::KvRole::kPrefill
                ? fmt::format("kv-role prefill: KV agent on {}:{}\n", so.host, srv.kv_port())
            : so.kv.role == server::KvRole::kDecode
                ? fmt::format("kv-role decode: prefills on {}\n", so.kv.peer)
                : "")
        << std::flush;

    int sig = 0;
    sigwait(&signals, &sig);
    out << fmt::format("mixkv serve: {}, draining (up to {} s)\n",
                       sig == SIGTERM ? "SIGTERM" : "SIGINT", so.shutdown_timeout)
        << std::flush;
    const bool drained = srv.shutdown();
    out << (drained ? "mixkv serve: drained, stopped\n"
                    : "mixkv serve: shutdown timeout; unfinished requests were cancelled\n")
        << std::flush;
  };
}

}  // namespace mixkv::cli
