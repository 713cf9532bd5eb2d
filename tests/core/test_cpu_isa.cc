// The start-up ISA check (zaya/core/cpu_isa.h): the missing-extension logic and message with an
// injected "CPU supports" set, so they are tested without a second CPU, and the real binary
// against the real CPU.
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include "zaya/core/cpu_isa.h"

namespace zaya {
namespace {

IsaList list_of(std::initializer_list<const char*> names) {
  IsaList l;
  for (const char* n : names) l.names[l.count++] = n;
  return l;
}

std::string joined(const IsaList& l) {
  std::string s;
  for (int i = 0; i < l.count; ++i) {
    if (i) s += ' ';
    s += l.names[i];
  }
  return s;
}

const IsaList kV3 = list_of({"sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "avx", "avx2", "bmi", "bmi2",
                             "f16c", "fma", "lzcnt", "movbe"});

TEST(CpuIsa, MissingIsWhatTheBuildUsesAndTheCpuLacks) {
  const IsaList built = list_of({"avx2", "fma", "avx512f", "avx512bw", "avx512bf16"});
  const IsaList cpu = list_of({"sse3", "avx2", "fma", "avx512f"});
  EXPECT_EQ(joined(missing_isa(built, cpu)), "avx512bw avx512bf16");  // in the build's order
  EXPECT_EQ(missing_isa(built, built).count, 0);
  EXPECT_EQ(missing_isa(IsaList{}, cpu).count, 0);  // a baseline build runs anywhere
}

TEST(CpuIsa, MessageNamesTheBuildTheMissingExtensionsAndTheFix) {
  const IsaList built = list_of({"avx2", "fma", "avx512f", "avx512bw"});
  const IsaList missing = list_of({"avx512f", "avx512bw"});
  char msg[2048];
  format_isa_error(msg, sizeof msg, "native", built, missing, kV3);
  const std::string m = msg;
  EXPECT_NE(m.find("built for -march=native"), std::string::npos) << m;
  EXPECT_NE(m.find("avx2, fma, avx512f, avx512bw"), std::string::npos) << m;
  EXPECT_NE(m.find("this CPU lacks avx512f, avx512bw."), std::string::npos) << m;
  EXPECT_NE(m.find("-DZAYA_ARCH=x86-64-v3"), std::string::npos) << m;  // the best level this CPU has

  char small[40];  // a short buffer truncates, terminated
  format_isa_error(small, sizeof small, "native", built, missing, kV3);
  EXPECT_EQ(std::string(small), m.substr(0, sizeof small - 1));
}

TEST(CpuIsa, BestLevelIsTheNewestWhoseExtensionsAllArePresent) {
  EXPECT_EQ(std::string(best_x86_64_level(IsaList{})), "x86-64");
  EXPECT_EQ(std::string(best_x86_64_level(list_of({"sse3", "ssse3", "sse4.1", "sse4.2", "popcnt"}))),
            "x86-64-v2");
  EXPECT_EQ(std::string(best_x86_64_level(kV3)), "x86-64-v3");
  IsaList v4 = kV3;
  for (const char* n : {"avx512f", "avx512bw", "avx512cd", "avx512dq"}) v4.names[v4.count++] = n;
  EXPECT_EQ(std::string(best_x86_64_level(v4)), "x86-64-v3");  // avx512vl missing
  v4.names[v4.count++] = "avx512vl";
  EXPECT_EQ(std::string(best_x86_64_level(v4)), "x86-64-v4");
}

// This test file is compiled with the build's -march, like cpu_isa_build.cc: the recorded list must
// agree with the compiler's macros here.
TEST(CpuIsa, TheRecordedBuildIsaMatchesTheCompilersMacros) {
  const IsaList built = build_isa();
  auto has = [&](const char* n) {
    for (int i = 0; i < built.count; ++i)
      if (std::string(built.names[i]) == n) return true;
    return false;
  };
#ifdef __AVX2__
  EXPECT_TRUE(has("avx2"));
#else
  EXPECT_FALSE(has("avx2"));
#endif
#ifdef __FMA__
  EXPECT_TRUE(has("fma"));
#else
  EXPECT_FALSE(has("fma"));
#endif
#ifdef __AVX512F__
  EXPECT_TRUE(has("avx512f"));
#else
  EXPECT_FALSE(has("avx512f"));
#endif
#ifdef __AVX512BF16__
  EXPECT_TRUE(has("avx512bf16"));
#else
  EXPECT_FALSE(has("avx512bf16"));
#endif
  EXPECT_FALSE(has("amx-tile"));  // AMX is dispatched at run time, never required
  EXPECT_STRNE(build_march(), "");
}

TEST(CpuIsa, ThisCpuPassesThisBuildsCheck) {
  const IsaList missing = missing_isa(build_isa(), cpu_isa());
  EXPECT_EQ(missing.count, 0) << "missing: " << joined(missing);
  require_build_isa();  // returns (it would exit 2 on a CPU that lacks an extension)
  char line[1024];
  format_build_isa(line, sizeof line);
  EXPECT_EQ(std::string(line).rfind(std::string("-march=") + build_march() + ": ", 0), 0u) << line;
}

}  // namespace
}  // namespace zaya
