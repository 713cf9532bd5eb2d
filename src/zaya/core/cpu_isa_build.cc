// What -march enabled for this build, as data only: this file is compiled with the build's -march
// like the rest of the code, so the predefined macros below describe the instructions the compiler
// may use everywhere else. It holds no code, so reading it is safe on any CPU (cpu_isa.cc does,
// from baseline x86-64 code). The order is cpu_isa.cc's table order.
#include "zaya/core/cpu_isa_build.h"

#ifndef ZAYA_ARCH
#error "ZAYA_ARCH (the -march value) must be defined by the build (CMakeLists.txt)"
#endif

namespace zaya::detail {

extern const char kBuildMarch[] = ZAYA_ARCH;

extern const char* const kBuildIsa[] = {
#ifdef __SSE3__
    "sse3",
#endif
#ifdef __SSSE3__
    "ssse3",
#endif
#ifdef __SSE4_1__
    "sse4.1",
#endif
#ifdef __SSE4_2__
    "sse4.2",
#endif
#ifdef __POPCNT__
    "popcnt",
#endif
#ifdef __AVX__
    "avx",
#endif
#ifdef __AVX2__
    "avx2",
#endif
#ifdef __FMA__
    "fma",
#endif
#ifdef __F16C__
    "f16c",
#endif
#ifdef __BMI__
    "bmi",
#endif
#ifdef __BMI2__
    "bmi2",
#endif
#ifdef __LZCNT__
    "lzcnt",
#endif
#ifdef __MOVBE__
    "movbe",
#endif
#ifdef __AVXVNNI__
    "avxvnni",
#endif
#ifdef __AVX512F__
    "avx512f",
#endif
#ifdef __AVX512CD__
    "avx512cd",
#endif
#ifdef __AVX512BW__
    "avx512bw",
#endif
#ifdef __AVX512DQ__
    "avx512dq",
#endif
#ifdef __AVX512VL__
    "avx512vl",
#endif
#ifdef __AVX512IFMA__
    "avx512ifma",
#endif
#ifdef __AVX512VBMI__
    "avx512vbmi",
#endif
#ifdef __AVX512VBMI2__
    "avx512vbmi2",
#endif
#ifdef __AVX512VNNI__
    "avx512vnni",
#endif
#ifdef __AVX512BITALG__
    "avx512bitalg",
#endif
#ifdef __AVX512VPOPCNTDQ__
    "avx512vpopcntdq",
#endif
#ifdef __AVX512BF16__
    "avx512bf16",
#endif
#ifdef __AVX512FP16__
    "avx512fp16",
#endif
    nullptr,  // keeps the array non-empty for a plain x86-64 build; not counted
};

extern const int kBuildIsaCount = static_cast<int>(sizeof(kBuildIsa) / sizeof(kBuildIsa[0])) - 1;

}  // namespace zaya::detail
