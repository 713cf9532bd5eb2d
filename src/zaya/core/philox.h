// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a
// counter-based generator, so element i of a stream is a pure function of (seed, offset + i).
// The same header compiles for host and device, which is why CPU and CUDA draw identical numbers.
//
// Stream layout: element j of stream (seed, offset) is lane (offset + j) % 4 of the block with
// counter {lo32(b), hi32(b), 0, 0}, b = (offset + j) / 4, and key {lo32(seed), hi32(seed)}.
#pragma once

#include <cmath>
#include <cstdint>

#include "zaya/core/dtype.h"

namespace zaya {

struct PhiloxBlock {
  uint32_t v[4];
};

ZAYA_HD inline PhiloxBlock philox4x32_10(PhiloxBlock ctr, uint32_t key0, uint32_t key1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // round multipliers
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // Weyl key increments
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kM0) * ctr.v[0];
    uint64_t p1 = static_cast<uint64_t>(kM1) * ctr.v[2];
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    ctr = PhiloxBlock{{hi1 ^ ctr.v[1] ^ key0, lo1, hi0 ^ ctr.v[3] ^ key1, lo0}};
    key0 += kW0;
    key1 += kW1;
  }
  return ctr;
}

ZAYA_HD inline PhiloxBlock philox_block(uint64_t seed, uint64_t block) {
  PhiloxBlock ctr{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0u, 0u}};
  return philox4x32_10(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// 24 random bits to a float in [0, 1): exact in float, identical on every device.
ZAYA_HD inline float philox_uniform(uint64_t seed, uint64_t index) {
  PhiloxBlock b = philox_block(seed, index >> 2);
  return static_cast<float>(b.v[index & 3] >> 8) * (1.0f / 16777216.0f);
}

// Standard normal by Box-Muller on lane pairs (0,1) and (2,3) of a block; even lanes take the
// cosine, odd lanes the sine. Computed in double and rounded once, so host and device agree.
ZAYA_HD inline float philox_normal(uint64_t seed, uint64_t index) {
  PhiloxBlock b = philox_block(seed, index >> 2);
  int lane = static_cast<int>(index & 3);
  int pair = lane >> 1;
  double u1 = (static_cast<double>(b.v[2 * pair] >> 8) + 1.0) * (1.0 / 16777216.0);  // (0, 1]
  double u2 = static_cast<double>(b.v[2 * pair + 1] >> 8) * (1.0 / 16777216.0);      // [0, 1)
  double r = sqrt(-2.0 * log(u1));
  double theta = 6.283185307179586 * u2;
  return static_cast<float>((lane & 1) ? r * sin(theta) : r * cos(theta));
}

}  // namespace zaya
