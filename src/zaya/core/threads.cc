#include "zaya/core/threads.h"

#include <omp.h>

#include <cerrno>
#include <cstdlib>
#include <string>
#include <thread>

#include "zaya/core/error.h"

extern "C" void openblas_set_num_threads(int);

namespace zaya {
namespace {

int hardware_threads() {
  const unsigned hw = std::thread::hardware_concurrency();
  return hw ? static_cast<int>(hw) : 1;
}

}  // namespace

int max_num_threads() { return 4 * hardware_threads(); }

int checked_num_threads(int64_t n, const std::string& what) {
  ZAYA_CHECK(n >= 1 && n <= max_num_threads(), what, ": expected a thread count in [1, ", max_num_threads(),
             "] (4 x the ", hardware_threads(), " hardware threads), found ", n);
  return static_cast<int>(n);
}

int default_num_threads() {
  if (const char* env = std::getenv("ZAYA_THREADS")) {
    char* end = nullptr;
    errno = 0;
    const long long n = std::strtoll(env, &end, 10);
    ZAYA_CHECK(end != env && *end == '\0' && errno == 0, "ZAYA_THREADS must be a positive integer, found '", env,
               "'");
    return checked_num_threads(n, "ZAYA_THREADS");
  }
  return hardware_threads();
}

void set_num_threads(int n) {
  if (n <= 0) n = default_num_threads();
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace zaya
