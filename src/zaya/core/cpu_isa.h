// The instruction-set extensions this binary was compiled for (CMake's ZAYA_ARCH, passed to -march)
// and the start-up check that the CPU has them: a binary copied to a machine that lacks one stops
// with a message naming what is missing and how to rebuild, instead of dying of SIGILL somewhere.
//
// The check runs before any other static initializer (apps/zaya.cc), from code compiled for baseline
// x86-64 (CMakeLists.txt). So everything here is plain C-style code: fixed arrays, pointers and
// snprintf. A template instance (std::string, std::vector, ...) could be replaced at link time by
// the copy another translation unit compiled with the wider instruction sets, and then the check
// itself would execute them.
#pragma once

#include <cstddef>

namespace zaya {

// Large enough for every extension the check knows (cpu_isa.cc's table).
constexpr int kMaxIsaFeatures = 40;

// Extension names as GCC's -m flags and __builtin_cpu_supports spell them ("avx512bw", "fma").
struct IsaList {
  const char* names[kMaxIsaFeatures] = {};
  int count = 0;
};

// The -march value the C++ code was compiled with: "native" or e.g. "x86-64-v3", "sapphirerapids".
const char* build_march();
// The extensions that -march enabled and that the compiler may use in the code it generates, in a
// fixed order. Left out: those GCC emits only for intrinsics zaya does not call (AES, GFNI, ...), and
// AMX, which the GEMM kernels use only after checking the CPU at run time (ops/cpu/amx_gemm.cc).
IsaList build_isa();
// The extensions of that table this CPU supports, with the operating system's support for their
// register state (libgcc's __builtin_cpu_supports checks XCR0 for AVX and AVX-512).
IsaList cpu_isa();
// The extensions of `built` that `cpu` lacks, in `built`'s order.
IsaList missing_isa(const IsaList& built, const IsaList& cpu);
// The newest x86-64 micro-architecture level ("x86-64-v4", "-v3", "-v2" or "x86-64") whose
// extensions `cpu` all has: the -DZAYA_ARCH the error message suggests.
const char* best_x86_64_level(const IsaList& cpu);
// The message for a CPU that lacks `missing` (not empty), written to out (at most size bytes,
// always terminated): names the build's -march and extensions, what is missing, and the fix.
void format_isa_error(char* out, size_t size, const char* march, const IsaList& built, const IsaList& missing,
                      const IsaList& cpu);
// "-march=X: ext1 ext2 ..." for `zaya sysinfo` and `zaya --version`.
void format_build_isa(char* out, size_t size);
// Prints "zaya: error: <message>" to stderr and exits with code 2 when this CPU lacks an extension
// the binary was built for; returns otherwise. Safe to call before main.
void require_build_isa();

}  // namespace zaya
