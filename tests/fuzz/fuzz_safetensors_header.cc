// libFuzzer target: the strict safetensors header parser on arbitrary bytes. Any input must end
// in a parsed header or a zaya::Error; a crash, hang, sanitizer report or other exception is a bug.
#include <cstddef>
#include <cstdint>
#include <span>

#include "zaya/ckpt/safetensors.h"
#include "zaya/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto h = zaya::ckpt::parse_safetensors({reinterpret_cast<const std::byte*>(data), size}, "fuzz.safetensors");
    // What a valid header promises: every tensor's bytes lie inside the input.
    for (const auto& t : h.tensors)
      if (h.data_start + t.end > size) __builtin_trap();
  } catch (const zaya::Error&) {
  }
  return 0;
}
