// The OpenAI-compatible request and error shapes `mixkv serve` speaks: each request body is
// parsed and checked here into a typed value before anything reaches the scheduler, and every
// failure is an ApiError carrying the HTTP status and OpenAI's error object
// ({"error": {"message", "type", "param", "code"}}). Pure functions: the HTTP layer
// (src/server/server.cpp) and the tests call them. docs/server.md lists the fields.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "mixkv/tokenizer/chat_template.hpp"

namespace mixkv::server {

using TokenId = std::int32_t;

// A request the server refuses: the status and OpenAI's error fields. `param` names the
// request field at fault (empty: none).
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string type = "invalid_request_error",
           std::string param = {}, std::string code = {});
  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }
  nlohmann::json body() const;  // {"error": {...}}, null param/code when empty

 private:
  int status_;
  std::string type_, param_, code_;
};

// OpenAI's error object for `status` with `message`, the shape ApiError::body() gives.
nlohmann::json error_body(int status, std::string_view message,
                          std::string_view type = "invalid_request_error",
                          std::string_view param = {}, std::string_view code = {});

// A prompt as the client sent it: text, or token ids.
struct Prompt {
  std::optional<std::string> text;
  std::vector<TokenId> ids;  // when text is absent
  bool operator==(const Prompt&) const = default;
};

// The sampling fields, validated here and applied by the engine's sampler (docs/server.md).
struct Sampling {
  std::optional<double> temperature, top_p;
  std::optional<std::int64_t> top_k, seed;
  bool operator==(const Sampling&) const = default;
};

// The fields both completion endpoints share.
struct GenerationParams {
  std::optional<std::string> model;
  std::optional<std::int64_t> max_tokens;  // absent: the endpoint's default
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool ignore_eos = false;     // vLLM's extension: generate max_tokens tokens, EOS or not
  Sampling sampling;
  bool operator==(const GenerationParams&) const = default;
};

struct CompletionRequest {
  std::vector<Prompt> prompts;  // one choice per prompt
  GenerationParams params;
  bool operator==(const CompletionRequest&) const = default;
};

struct ChatRequest {
  std::vector<tokenizer::ChatMessage> messages;
  GenerationParams params;
  bool operator==(const ChatRequest&) const = default;
};

struct TokenizeRequest {
  std::string prompt;
  bool add_special_tokens = false;
};

// Limits the parser checks (the server fills them from its options and the model).
struct Limits {
  std::int64_t vocab_size = 0;     // token ids must lie in [0, vocab_size)
  std::size_t max_prompts = 16;    // prompts in one completion request
  std::size_t max_stop = 4;        // stop sequences (OpenAI's limit)
  std::size_t max_messages = 256;  // chat messages
};

// Parse a body (JSON text) into the request, or throw ApiError (400) naming the field.
// Unknown fields are ignored, as OpenAI's API does; a known field of the wrong type or out of
// range is an error; null counts as absent.
nlohmann::json parse_body(std::string_view body);
CompletionRequest parse_completion(const nlohmann::json& body, const Limits& limits);
ChatRequest parse_chat(const nlohmann::json& body, const Limits& limits);
TokenizeRequest parse_tokenize(const nlohmann::json& body);
std::vector<TokenId> parse_detokenize(const nlohmann::json& body, const Limits& limits);

// The OpenAPI 3.0 description served at /openapi.json, with the model's limits in its schemas
// (token ids below vocab_size), so a fuzzer that follows it knows what is valid.
nlohmann::json openapi_document(const Limits& limits, std::string_view model_name);

}  // namespace mixkv::server
