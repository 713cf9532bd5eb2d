// The size of the CPU caches, for the kernels that choose a different way to write outputs that
// cannot stay in them (softmax's streaming stores) and the benchmarks that must run beyond them.
#pragma once

#include <cstdint>

namespace zaya {

// Bytes a streaming kernel could hide in: L2 per core × online cores + L3, as the OS reports them
// (sysconf); 64 MiB when it reports none. Read once.
int64_t cpu_cache_bytes();

}  // namespace zaya
