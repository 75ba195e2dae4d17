#include "mixkv/server/api.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "mixkv/core/json_int.hpp"

namespace mixkv::server {
namespace {

using nlohmann::json;

// A value as it appears in a message: short, and valid UTF-8 whatever the client sent.
std::string shown(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

[[noreturn]] void bad(std::string_view param, const std::string& message) {
  throw ApiError(400, message, "invalid_request_error", std::string(param));
}

// The field, or null when absent (null and absent mean the same).
const json& field(const json& body, std::string_view name) {
  static const json kNull;
  const auto it = body.find(name);
  return it == body.end() ? kNull : *it;
}

// An integer: a JSON integer, or a number with no fractional part (JSON Schema's integer).
std::optional<std::int64_t> as_integer(const json& v) {
  if (v.is_number_integer()) return json_int64(v);
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) {
      return static_cast<std::int64_t>(d);
    }
  }
  return std::nullopt;
}

std::optional<std::int64_t> integer_field(const json& body, std::string_view name, std::int64_t min,
                                          std::int64_t max) {
  const json& v = field(body, name);
  if (v.is_null()) return std::nullopt;
  const auto i = as_integer(v);
  if (!i || *i < min || *i > max) {
    bad(name,
        fmt::format("'{}' must be an integer from {} to {}; got {}", name, min, max, shown(v)));
  }
  return i;
}

std::optional<double> number_field(const json& body, std::string_view name, double min, double max,
                                   bool min_exclusive) {
  const json& v = field(body, name);
  if (v.is_null()) return std::nullopt;
  if (!v.is_number()) bad(name, fmt::format("'{}' must be a number; got {}", name, shown(v)));
  const double d = v.get<double>();
  if (!(d <= max) || (min_exclusive ? !(d > min) : !(d >= min))) {
    bad(name, fmt::format("'{}' must be in {}{}, {}]; got {}", name, min_exclusive ? "(" : "[", min,
                          max, shown(v)));
  }
  return d;
}

bool bool_field(const json& body, std::string_view name, std::string_view shown_name = {}) {
  const json& v = field(body, name);
  if (v.is_null()) return false;
  if (!v.is_boolean()) {
    bad(shown_name.empty() ? name : shown_name,
        fmt::format("'{}' must be true or false; got {}", shown_name.empty() ? name : shown_name,
                    shown(v)));
  }
  return v.get<bool>();
}

std::optional<std::string> string_field(const json& body, std::string_view name) {
  const json& v = field(body, name);
  if (v.is_null()) return std::nullopt;
  if (!v.is_string()) bad(name, fmt::format("'{}' must be a string; got {}", name, shown(v)));
  return v.get<std::string>();
}

// Fields of OpenAI's API that change the answer in ways mixkv does not serve: refused unless at
// their default, so a client never gets an answer that silently ignores them.
void refuse_unsupported(const json& body) {
  struct Field {
    std::string_view name;
    bool (*is_default)(const json&);
  };
  static constexpr Field kFields[] = {
      {"logprobs", [](const json& v) { return v.is_null() || v == false || v == 0; }},
      {"top_logprobs", [](const json& v) { return v.is_null() || v == 0; }},
      {"echo", [](const json& v) { return v.is_null() || v == false; }},
      {"best_of", [](const json& v) { return v.is_null() || v == 1; }},
      {"suffix", [](const json& v) { return v.is_null() || v == ""; }},
      {"logit_bias", [](const json& v) { return v.is_null() || (v.is_object() && v.empty()); }},
      {"presence_penalty", [](const json& v) { return v.is_null() || v == 0; }},
      {"frequency_penalty", [](const json& v) { return v.is_null() || v == 0; }},
      {"tools", [](const json& v) { return v.is_null() || (v.is_array() && v.empty()); }},
      {"response_format",
       [](const json& v) { return v.is_null() || (v.is_object() && field(v, "type") == "text"); }},
  };
  for (const Field& f : kFields) {
    if (!f.is_default(field(body, f.name))) {
      bad(f.name, fmt::format("'{}' is not supported by mixkv serve; leave it out (docs/server.md)",
                              f.name));
    }
  }
}

GenerationParams parse_params(const json& body, const Limits& limits, bool chat) {
  GenerationParams p;
  p.model = string_field(body, "model");
  p.max_tokens = integer_field(body, "max_tokens", 1, std::numeric_limits<std::int32_t>::max());
  if (chat) {
    if (auto m = integer_field(body, "max_completion_tokens", 1,
                               std::numeric_limits<std::int32_t>::max())) {
      p.max_tokens = m;
    }
  }
  if (const auto n = integer_field(body, "n", 1, std::numeric_limits<std::int32_t>::max());
      n && *n != 1) {
    bad("n", fmt::format("'n' must be 1 (one choice per prompt); got {}", *n));
  }
  const json& stop = field(body, "stop");
  if (stop.is_string()) {
    p.stop.push_back(stop.get<std::string>());
  } else if (stop.is_array()) {
    if (stop.size() > limits.max_stop) {
      bad("stop",
          fmt::format("'stop' takes at most {} sequences; got {}", limits.max_stop, stop.size()));
    }
    for (const json& s : stop) {
      if (!s.is_string()) bad("stop", fmt::format("'stop' must hold strings; got {}", shown(s)));
      p.stop.push_back(s.get<std::string>());
    }
  } else if (!stop.is_null()) {
    bad("stop", fmt::format("'stop' must be a string or a list of strings; got {}", shown(stop)));
  }
  for (const std::string& s : p.stop) {
    if (s.empty()) bad("stop", "'stop' sequences must not be empty");
  }
  p.stream = bool_field(body, "stream");
  const json& so = field(body, "stream_options");
  if (!so.is_null()) {
    if (!so.is_object()) {
      bad("stream_options", fmt::format("'stream_options' must be an object; got {}", shown(so)));
    }
    p.include_usage = bool_field(so, "include_usage", "stream_options.include_usage");
  }
  p.ignore_eos = bool_field(body, "ignore_eos");
  p.sampling.temperature = number_field(body, "temperature", 0, 2, false);
  p.sampling.top_p = number_field(body, "top_p", 0, 1, true);
  p.sampling.top_k = integer_field(body, "top_k", -1, std::numeric_limits<std::int32_t>::max());
  p.sampling.seed = integer_field(body, "seed", std::numeric_limits<std::int64_t>::min(),
                                  std::numeric_limits<std::int64_t>::max());
  refuse_unsupported(body);
  return p;
}

std::vector<TokenId> token_ids(const json& v, const Limits& limits, std::string_view param) {
  if (v.empty()) bad(param, fmt::format("'{}' is an empty list of token ids", param));
  std::vector<TokenId> ids;
  ids.reserve(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const auto id = as_integer(v[i]);
    if (!id || *id < 0 || *id >= limits.vocab_size) {
      bad(param, fmt::format("'{}' token {} is {}; token ids lie in [0, {})", param, i, shown(v[i]),
                             limits.vocab_size));
    }
    ids.push_back(static_cast<TokenId>(*id));
  }
  return ids;
}

const json& object_body(const json& body) {
  if (!body.is_object()) {
    throw ApiError(400, fmt::format("the request body must be a JSON object; got {}", shown(body)));
  }
  return body;
}

}  // namespace

ApiError::ApiError(int status, std::string message, std::string type, std::string param,
                   std::string code)
    : std::runtime_error(std::move(message)),
      status_(status),
      type_(std::move(type)),
      param_(std::move(param)),
      code_(std::move(code)) {}

json ApiError::body() const { return error_body(status_, what(), type_, param_, code_); }

json error_body(int status, std::string_view message, std::string_view type, std::string_view param,
                std::string_view code) {
  json e = {{"message", message},
            {"type", type},
            {"param", param.empty() ? json() : json(param)},
            {"code", code.empty() ? json(status) : json(code)}};
  return {{"error", std::move(e)}};
}

json parse_body(std::string_view body) {
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded()) {
    throw ApiError(400, "the request body is not valid JSON; send a JSON object",
                   "invalid_request_error", {}, "invalid_json");
  }
  return j;
}

CompletionRequest parse_completion(const json& b, const Limits& limits) {
  const json& body = object_body(b);
  CompletionRequest r;
  const json& prompt = field(body, "prompt");
  if (prompt.is_string()) {
    r.prompts.push_back({prompt.get<std::string>(), {}});
  } else if (prompt.is_array() && !prompt.empty()) {
    const json& first = prompt.front();
    if (first.is_number()) {
      r.prompts.push_back({std::nullopt, token_ids(prompt, limits, "prompt")});
    } else {
      if (prompt.size() > limits.max_prompts) {
        bad("prompt", fmt::format("'prompt' holds {} prompts; at most {} per request",
                                  prompt.size(), limits.max_prompts));
      }
      // A list of prompts is all strings or all token-id lists, as OpenAI's schema has it.
      const bool strings = first.is_string();
      for (const json& p : prompt) {
        if (strings && p.is_string()) {
          r.prompts.push_back({p.get<std::string>(), {}});
        } else if (!strings && p.is_array()) {
          r.prompts.push_back({std::nullopt, token_ids(p, limits, "prompt")});
        } else {
          bad("prompt", fmt::format("'prompt' lists must hold only strings or only token-id "
                                    "lists; got {}",
                                    shown(p)));
        }
      }
    }
  } else if (prompt.is_null()) {
    bad("prompt", "'prompt' is required: a string, a list of token ids, or a list of either");
  } else {
    bad("prompt", fmt::format("'prompt' must be a non-empty string, a list of token ids, or a "
                              "list of either; got {}",
                              shown(prompt)));
  }
  for (const Prompt& p : r.prompts) {
    if (p.text && p.text->empty()) bad("prompt", "'prompt' is an empty string");
  }
  r.params = parse_params(body, limits, false);
  return r;
}

ChatRequest parse_chat(const json& b, const Limits& limits) {
  const json& body = object_body(b);
  ChatRequest r;
  const json& messages = field(body, "messages");
  if (!messages.is_array() || messages.empty()) {
    bad("messages", fmt::format("'messages' must be a non-empty list of {{\"role\", \"content\"}} "
                                "objects; got {}",
                                shown(messages)));
  }
  if (messages.size() > limits.max_messages) {
    bad("messages", fmt::format("'messages' holds {} messages; at most {}", messages.size(),
                                limits.max_messages));
  }
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object())
      bad("messages", fmt::format("{} must be an object; got {}", where, shown(m)));
    const json& role = field(m, "role");
    if (!role.is_string() ||
        (role != "system" && role != "user" && role != "assistant" && role != "developer")) {
      bad("messages", fmt::format("{}.role must be \"system\", \"developer\", \"user\" or "
                                  "\"assistant\"; got {}",
                                  where, shown(role)));
    }
    const json& content = field(m, "content");
    std::string text;
    if (content.is_string()) {
      text = content.get<std::string>();
    } else if (content.is_array()) {
      // OpenAI's content parts: only text parts, concatenated.
      for (const json& part : content) {
        if (!part.is_object() || field(part, "type") != "text" ||
            !field(part, "text").is_string()) {
          bad("messages", fmt::format("{}.content parts must be {{\"type\": \"text\", \"text\": "
                                      "...}}; got {}",
                                      where, shown(part)));
        }
        text += field(part, "text").get<std::string>();
      }
    } else {
      bad("messages", fmt::format("{}.content must be a string or a list of text parts; got {}",
                                  where, shown(content)));
    }
    // The templates know system, user and assistant; a developer message is a system one.
    std::string r_name = role.get<std::string>();
    r.messages.push_back({r_name == "developer" ? "system" : r_name, std::move(text)});
  }
  r.params = parse_params(body, limits, true);
  return r;
}

TokenizeRequest parse_tokenize(const json& b) {
  const json& body = object_body(b);
  TokenizeRequest r;
  const json& prompt = field(body, "prompt");
  if (!prompt.is_string()) {
    bad("prompt", fmt::format("'prompt' must be a string; got {}", shown(prompt)));
  }
  r.prompt = prompt.get<std::string>();
  r.add_special_tokens = bool_field(body, "add_special_tokens");
  (void)string_field(body, "model");
  return r;
}

std::vector<TokenId> parse_detokenize(const json& b, const Limits& limits) {
  const json& body = object_body(b);
  const json& tokens = field(body, "tokens");
  if (!tokens.is_array()) {
    bad("tokens", fmt::format("'tokens' must be a list of token ids; got {}", shown(tokens)));
  }
  (void)string_field(body, "model");
  if (tokens.empty()) return {};
  return token_ids(tokens, limits, "tokens");
}

}  // namespace mixkv::server
