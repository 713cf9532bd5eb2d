// The start-up ISA check. Compiled for baseline x86-64 (CMakeLists.txt) and written without
// templates (see cpu_isa.h), so that it runs on any x86-64 CPU whatever the build's -march.
#include "zaya/core/cpu_isa.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "zaya/core/cpu_isa_build.h"

namespace zaya {
namespace {

struct IsaProbe {
  const char* name;
  bool (*cpu_has)();
};

// __builtin_cpu_supports takes only a string literal, hence one function per extension.
#define ZAYA_ISA_PROBE(name)                               \
  IsaProbe {                                               \
    name, [] { return __builtin_cpu_supports(name) != 0; } \
  }

// Every extension cpu_isa_build.cc may record, in its order.
constexpr IsaProbe kProbes[] = {
    ZAYA_ISA_PROBE("sse3"),
    ZAYA_ISA_PROBE("ssse3"),
    ZAYA_ISA_PROBE("sse4.1"),
    ZAYA_ISA_PROBE("sse4.2"),
    ZAYA_ISA_PROBE("popcnt"),
    ZAYA_ISA_PROBE("avx"),
    ZAYA_ISA_PROBE("avx2"),
    ZAYA_ISA_PROBE("fma"),
    ZAYA_ISA_PROBE("f16c"),
    ZAYA_ISA_PROBE("bmi"),
    ZAYA_ISA_PROBE("bmi2"),
    ZAYA_ISA_PROBE("lzcnt"),
    ZAYA_ISA_PROBE("movbe"),
    ZAYA_ISA_PROBE("avxvnni"),
    ZAYA_ISA_PROBE("avx512f"),
    ZAYA_ISA_PROBE("avx512cd"),
    ZAYA_ISA_PROBE("avx512bw"),
    ZAYA_ISA_PROBE("avx512dq"),
    ZAYA_ISA_PROBE("avx512vl"),
    ZAYA_ISA_PROBE("avx512ifma"),
    ZAYA_ISA_PROBE("avx512vbmi"),
    ZAYA_ISA_PROBE("avx512vbmi2"),
    ZAYA_ISA_PROBE("avx512vnni"),
    ZAYA_ISA_PROBE("avx512bitalg"),
    ZAYA_ISA_PROBE("avx512vpopcntdq"),
    ZAYA_ISA_PROBE("avx512bf16"),
    ZAYA_ISA_PROBE("avx512fp16"),
};
#undef ZAYA_ISA_PROBE
static_assert(sizeof(kProbes) / sizeof(kProbes[0]) <= kMaxIsaFeatures);

// The x86-64 micro-architecture levels, each adding to the one before (the psABI's definition,
// restricted to the extensions of the table above).
constexpr const char* kLevelV2[] = {"sse3", "ssse3", "sse4.1", "sse4.2", "popcnt"};
constexpr const char* kLevelV3[] = {"avx", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe"};
constexpr const char* kLevelV4[] = {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"};

bool contains(const IsaList& list, const char* name) {
  for (int i = 0; i < list.count; ++i)
    if (std::strcmp(list.names[i], name) == 0) return true;
  return false;
}

template <size_t N>
bool contains_all(const IsaList& list, const char* const (&names)[N]) {
  for (const char* n : names)
    if (!contains(list, n)) return false;
  return true;
}

// snprintf at *pos, never past size; *pos stops at the end of what fits.
__attribute__((format(printf, 4, 5))) void append(char* out, size_t size, size_t* pos, const char* fmt, ...) {
  if (*pos + 1 >= size) return;
  va_list args;
  va_start(args, fmt);
  const int n = std::vsnprintf(out + *pos, size - *pos, fmt, args);
  va_end(args);
  if (n > 0) *pos = *pos + static_cast<size_t>(n) < size ? *pos + static_cast<size_t>(n) : size - 1;
}

void append_list(char* out, size_t size, size_t* pos, const IsaList& list, const char* sep) {
  for (int i = 0; i < list.count; ++i) append(out, size, pos, "%s%s", i ? sep : "", list.names[i]);
}

}  // namespace

const char* build_march() { return detail::kBuildMarch; }

IsaList build_isa() {
  IsaList l;
  for (int i = 0; i < detail::kBuildIsaCount && l.count < kMaxIsaFeatures; ++i)
    l.names[l.count++] = detail::kBuildIsa[i];
  return l;
}

IsaList cpu_isa() {
  __builtin_cpu_init();  // before main libgcc's own initializer may not have run yet
  IsaList l;
  for (const IsaProbe& p : kProbes)
    if (p.cpu_has()) l.names[l.count++] = p.name;
  return l;
}

IsaList missing_isa(const IsaList& built, const IsaList& cpu) {
  IsaList l;
  for (int i = 0; i < built.count; ++i)
    if (!contains(cpu, built.names[i])) l.names[l.count++] = built.names[i];
  return l;
}

const char* best_x86_64_level(const IsaList& cpu) {
  if (!contains_all(cpu, kLevelV2)) return "x86-64";
  if (!contains_all(cpu, kLevelV3)) return "x86-64-v2";
  if (!contains_all(cpu, kLevelV4)) return "x86-64-v3";
  return "x86-64-v4";
}

void format_isa_error(char* out, size_t size, const char* march, const IsaList& built, const IsaList& missing,
                      const IsaList& cpu) {
  if (size == 0) return;
  out[0] = '\0';
  size_t pos = 0;
  append(out, size, &pos, "this binary was built for -march=%s, which lets the compiler use ", march);
  append_list(out, size, &pos, built, ", ");
  append(out, size, &pos, "; this CPU lacks ");
  append_list(out, size, &pos, missing, ", ");
  append(out, size, &pos,
         ". Rebuild zaya on this machine (the default -DZAYA_ARCH=native), or configure with "
         "-DZAYA_ARCH=%s (the newest x86-64 level this CPU has) for a binary that runs on it",
         best_x86_64_level(cpu));
}

void format_build_isa(char* out, size_t size) {
  if (size == 0) return;
  out[0] = '\0';
  size_t pos = 0;
  append(out, size, &pos, "-march=%s: ", build_march());
  const IsaList built = build_isa();
  if (built.count == 0) append(out, size, &pos, "baseline x86-64 only");
  append_list(out, size, &pos, built, " ");
}

void require_build_isa() {
  const IsaList cpu = cpu_isa();
  const IsaList built = build_isa();
  const IsaList missing = missing_isa(built, cpu);
  if (missing.count == 0) return;
  char message[2048];
  format_isa_error(message, sizeof message, build_march(), built, missing, cpu);
  std::fprintf(stderr, "zaya: error: %s\n", message);
  std::exit(2);
}

}  // namespace zaya
