// The data cpu_isa_build.cc records at compile time; read through zaya/core/cpu_isa.h.
#pragma once

namespace zaya::detail {

extern const char kBuildMarch[];
extern const char* const kBuildIsa[];  // kBuildIsaCount names, then nullptr
extern const int kBuildIsaCount;

}  // namespace zaya::detail
