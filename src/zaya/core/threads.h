// One thread-count setting for everything that spawns threads: OpenMP (our kernels and oneDNN,
// which Debian builds on OpenMP) and OpenBLAS.
#pragma once

#include <cstdint>
#include <string>

namespace zaya {

// Sets the thread count for OpenMP, oneDNN and OpenBLAS. n <= 0 means "all hardware threads".
void set_num_threads(int n);
int num_threads();
// Thread count to use when none is configured: $ZAYA_THREADS if set (checked by
// checked_num_threads), else the hardware threads.
int default_num_threads();

// The most threads a user may ask for: 4 × the hardware threads. More only oversubscribes the
// cores, and far more breaks the runtimes: every OpenMP thread reserves a stack, and libgomp
// crashes or exhausts memory when asked for tens of thousands.
int max_num_threads();
// A user's thread count n from `what` ("--threads", "ZAYA_THREADS"): n itself when it is in
// [1, max_num_threads()], else a zaya::Error naming `what`, the range and n.
int checked_num_threads(int64_t n, const std::string& what);

}  // namespace zaya
