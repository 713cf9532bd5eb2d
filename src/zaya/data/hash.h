// Small fixed hashes for the data layer's seeded decisions (train/val split, shuffle keys). Fixed
// here rather than std::hash so that a seed means the same thing on every platform and library.
#pragma once

#include <cstdint>

namespace zaya::data {

// SplitMix64's finalizer (Steele, Lea, Flood 2014): a bijective 64-bit mix.
inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace zaya::data
