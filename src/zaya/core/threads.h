// One thread-count setting for everything that spawns threads: OpenMP (our kernels and oneDNN,
// which Debian builds on OpenMP) and OpenBLAS.
#pragma once

namespace zaya {

// Sets the thread count for OpenMP, oneDNN and OpenBLAS. n <= 0 means "all hardware threads".
void set_num_threads(int n);
int num_threads();
// Thread count to use when none is configured: $ZAYA_THREADS if set, else the hardware threads.
int default_num_threads();

}  // namespace zaya
