// libFuzzer target: the chunk-list parser (a rank's report to rank 0 in a multi-process save) on
// arbitrary text, read as rank 1's list of step 7 in a world of 4. Any input must end in a
// RankChunks or a zaya::Error; a crash, hang, sanitizer report or other exception is a bug.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "zaya/ckpt/rank_save.h"
#include "zaya/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const zaya::ckpt::RankChunks rc =
        zaya::ckpt::parse_chunk_list({reinterpret_cast<const char*>(data), size}, "fuzz/rank_00001.chunks.json", 7, 4, 1);
    // A parsed list must serialize and parse back to the same text.
    const std::string text = zaya::ckpt::chunk_list_to_string(rc, 7, 4);
    const zaya::ckpt::RankChunks again = zaya::ckpt::parse_chunk_list(text, "fuzz/again.json", 7, 4, 1);
    if (zaya::ckpt::chunk_list_to_string(again, 7, 4) != text) __builtin_trap();
  } catch (const zaya::Error&) {
  }
  return 0;
}
