// The OpenAPI 3.1 description of what `mixkv serve` accepts. It states exactly the checks of
// api.cpp (types, ranges, required fields, nullable optionals), so a fuzzer that sends bodies
// violating it must get 4xx, and bodies following it are served. Fields mixkv refuses
// (logprobs, penalties, tools) are left out.
#include <fmt/format.h>

#include <limits>

#include "mixkv/server/api.hpp"

namespace mixkv::server {
namespace {

using nlohmann::json;

json nullable(json type) { return json::array({std::move(type), "null"}); }

json token_id(const Limits& limits) {
  return {{"type", "integer"}, {"minimum", 0}, {"maximum", limits.vocab_size - 1}};
}

json token_ids(const Limits& limits) {
  return {{"type", "array"}, {"minItems", 1}, {"items", token_id(limits)}};
}

// The fields both completion endpoints take.
json generation_properties() {
  const auto int32_max = std::numeric_limits<std::int32_t>::max();
  return {
      {"model", {{"type", nullable("string")}}},
      {"max_tokens", {{"type", nullable("integer")}, {"minimum", 1}, {"maximum", int32_max}}},
      {"n", {{"type", nullable("integer")}, {"minimum", 1}, {"maximum", 1}}},
      {"stop",
       {{"oneOf", json::array({{{"type", "null"}},
                               {{"type", "string"}, {"minLength", 1}},
                               {{"type", "array"},
                                {"maxItems", 4},
                                {"items", {{"type", "string"}, {"minLength", 1}}}}})}}},
      {"stream", {{"type", nullable("boolean")}}},
      {"stream_options",
       {{"type", nullable("object")},
        {"properties", {{"include_usage", {{"type", nullable("boolean")}}}}}}},
      {"ignore_eos", {{"type", nullable("boolean")}}},
      {"temperature", {{"type", nullable("number")}, {"minimum", 0}, {"maximum", 2}}},
      {"top_p", {{"type", nullable("number")}, {"exclusiveMinimum", 0}, {"maximum", 1}}},
      {"top_k", {{"type", nullable("integer")}, {"minimum", -1}, {"maximum", int32_max}}},
      {"seed",
       {{"type", nullable("integer")},
        {"minimum", std::numeric_limits<std::int64_t>::min()},
        {"maximum", std::numeric_limits<std::int64_t>::max()}}},
  };
}

json json_body(json schema) {
  return {{"required", true}, {"content", {{"application/json", {{"schema", std::move(schema)}}}}}};
}

json responses(std::string_view what) {
  return {
      {"200", {{"description", what}}},
      {"default",
       {{"description", "an error: {\"error\": {\"message\", \"type\", \"param\", \"code\"}}"}}}};
}

json post(std::string_view summary, json schema, std::string_view what) {
  return {{"post",
           {{"summary", summary},
            {"requestBody", json_body(std::move(schema))},
            {"responses", responses(what)}}}};
}

json get(std::string_view summary, std::string_view what) {
  return {{"get", {{"summary", summary}, {"responses", responses(what)}}}};
}

}  // namespace

json openapi_document(const Limits& limits, std::string_view model_name) {
  json completion_props = generation_properties();
  completion_props["prompt"] = {
      {"oneOf", json::array({{{"type", "string"}, {"minLength", 1}},
                             token_ids(limits),
                             {{"type", "array"},
                              {"minItems", 1},
                              {"maxItems", limits.max_prompts},
                              {"items", {{"type", "string"}, {"minLength", 1}}}},
                             {{"type", "array"},
                              {"minItems", 1},
                              {"maxItems", limits.max_prompts},
                              {"items", token_ids(limits)}}})}};
  const json completion = {
      {"type", "object"}, {"required", {"prompt"}}, {"properties", completion_props}};

  json chat_props = generation_properties();
  chat_props["max_completion_tokens"] = chat_props["max_tokens"];
  const json text_part = {
      {"type", "object"},
      {"required", {"type", "text"}},
      {"properties", {{"type", {{"const", "text"}}}, {"text", {{"type", "string"}}}}}};
  chat_props["messages"] = {
      {"type", "array"},
      {"minItems", 1},
      {"maxItems", limits.max_messages},
      {"items",
       {{"type", "object"},
        {"required", {"role", "content"}},
        {"properties",
         {{"role", {{"enum", {"system", "developer", "user", "assistant"}}}},
          {"content",
           {{"oneOf",
             json::array({{{"type", "string"}}, {{"type", "array"}, {"items", text_part}}})}}}}}}}};
  const json chat = {{"type", "object"}, {"required", {"messages"}}, {"properties", chat_props}};

  const json tokenize = {{"type", "object"},
                         {"required", {"prompt"}},
                         {"properties",
                          {{"model", {{"type", nullable("string")}}},
                           {"prompt", {{"type", "string"}}},
                           {"add_special_tokens", {{"type", nullable("boolean")}}}}}};
  const json detokenize = {{"type", "object"},
                           {"required", {"tokens"}},
                           {"properties",
                            {{"model", {{"type", nullable("string")}}},
                             {"tokens", {{"type", "array"}, {"items", token_id(limits)}}}}}};

  json paths = {
      {"/v1/completions", post("Text completion (OpenAI)", completion, "a text_completion")},
      {"/v1/chat/completions",
       post("Chat completion (OpenAI), rendered with the model's chat template", chat,
            "a chat.completion")},
      {"/tokenize", post("Token ids of a prompt", tokenize, "{tokens, count, max_model_len}")},
      {"/detokenize", post("Text of token ids", detokenize, "{prompt}")},
      {"/v1/models", get("The served model", "a list of one model")},
      {"/health", get("200 once the model is loaded, 503 before", "empty")},
      {"/metrics", get("Prometheus text format", "metrics")},
  };
  return {{"openapi", "3.1.0"},
          {"info",
           {{"title", "mixkv serve"},
            {"version", "1"},
            {"description", fmt::format("OpenAI-compatible API serving {}", model_name)}}},
          {"paths", std::move(paths)}};
}

}  // namespace mixkv::server
