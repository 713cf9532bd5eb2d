#include "zaya/core/cpu_caches.h"

#include <unistd.h>

#include <algorithm>

namespace zaya {

int64_t cpu_cache_bytes() {
  static const int64_t bytes = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE), l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const int64_t sum = int64_t{std::max(0L, l2)} * std::max(1L, cores) + std::max(0L, l3);
    return sum > 0 ? sum : int64_t{64} << 20;
  }();
  return bytes;
}

}  // namespace zaya
