// Chunk checksums: CRC32C (Castagnoli), as iSCSI, ext4 and RocksDB use it.
//
// Why CRC32C rather than a 64-bit hash: it catches every burst error up to 32 bits and every odd
// number of flipped bits, x86 computes it in hardware (SSE4.2 `crc32`, ~8 bytes per cycle per
// stream) and it needs no third-party library. A checkpoint checksum guards against torn writes
// and bit rot, not adversaries, so 32 bits per chunk is enough.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace zaya::ckpt {

// CRC32C of `n` bytes, continuing from `crc` (0 to start). crc32c("123456789") == 0xE3069283.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

// "crc32c:e3069283": the algorithm is part of the stored string so a later format can change it.
std::string format_checksum(uint32_t crc);
// Parses the string above; returns false if it is not one.
bool parse_checksum(const std::string& text, uint32_t* crc);

}  // namespace zaya::ckpt
