#include "zaya/core/threads.h"

#include <omp.h>

#include <cstdlib>
#include <string>
#include <thread>

#include "zaya/core/error.h"

extern "C" void openblas_set_num_threads(int);

namespace zaya {

int default_num_threads() {
  if (const char* env = std::getenv("ZAYA_THREADS")) {
    char* end = nullptr;
    long n = std::strtol(env, &end, 10);
    ZAYA_CHECK(end != env && *end == '\0' && n > 0,
               "ZAYA_THREADS must be a positive integer, found '", env, "'");
    return static_cast<int>(n);
  }
  unsigned hw = std::thread::hardware_concurrency();
  return hw ? static_cast<int>(hw) : 1;
}

void set_num_threads(int n) {
  if (n <= 0) n = default_num_threads();
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace zaya
