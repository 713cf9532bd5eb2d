// Strict JSON parsing for untrusted files (safetensors headers, manifests).
//
// nlohmann::json silently keeps the last of two equal keys; a file that names a tensor twice must
// be rejected, so the parse runs with a callback that tracks the keys of every open object. It
// also bounds the nesting depth, so a hostile "[[[[..." cannot exhaust memory or the stack.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace zaya::ckpt {

// Parses `text`; throws zaya::Error naming `what` (a file name) on malformed JSON, duplicate keys
// (naming the key) or nesting deeper than `max_depth`.
nlohmann::json parse_json_strict(std::string_view text, const std::string& what, int max_depth = 64);

// Short printable form of a JSON value for error messages (at most ~60 characters).
std::string json_brief(const nlohmann::json& v);

}  // namespace zaya::ckpt
