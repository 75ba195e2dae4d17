// libFuzzer entry point for the server's request bodies: any bytes, as the body of each endpoint
// (completions, chat completions, tokenize, detokenize), must parse into a request or throw
// ApiError with a 4xx status. Anything else (a JSON type error the HTTP layer would answer with
// a 500, a crash, a sanitizer report) is a finding. tests/server/clients_test.py fuzzes the
// running server over HTTP with schemathesis; this reaches the parsers directly. See
// fuzz/CMakeLists.txt.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "mixkv/server/api.hpp"

namespace {

template <typename Parse>
void parse_or_refuse(const nlohmann::json& body, Parse parse) {
  try {
    (void)parse(body);
  } catch (const mixkv::server::ApiError& e) {
    if (e.status() < 400 || e.status() >= 500) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace api = mixkv::server;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  api::Limits limits;
  limits.vocab_size = 49152;  // SmolLM2's vocabulary
  nlohmann::json body;
  try {
    body = api::parse_body(text);
  } catch (const api::ApiError& e) {
    if (e.status() != 400) std::abort();
    return 0;
  }
  parse_or_refuse(body, [&](const auto& b) { return api::parse_completion(b, limits); });
  parse_or_refuse(body, [&](const auto& b) { return api::parse_chat(b, limits); });
  parse_or_refuse(body, [&](const auto& b) { return api::parse_tokenize(b); });
  parse_or_refuse(body, [&](const auto& b) { return api::parse_detokenize(b, limits); });
  return 0;
}
