// libFuzzer target: the checkpoint manifest parser on arbitrary text. Any input must end in a
// Manifest or a zaya::Error; a crash, hang, sanitizer report or other exception is a bug.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "zaya/ckpt/manifest.h"
#include "zaya/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto m = zaya::ckpt::parse_manifest({reinterpret_cast<const char*>(data), size}, "fuzz/manifest.json");
    // A parsed manifest must serialize and parse back to the same thing.
    auto again = zaya::ckpt::parse_manifest(zaya::ckpt::manifest_to_string(m), "fuzz/again.json");
    if (zaya::ckpt::manifest_to_json(again) != zaya::ckpt::manifest_to_json(m)) __builtin_trap();
  } catch (const zaya::Error&) {
  }
  return 0;
}
