// Which zaya wrote a file: the program's entry point records the commit it was built from (a
// header generated at build time into the app, not the libraries, so a library rebuild is not
// forced by every commit), and whatever writes a record (a checkpoint's manifest) reads it here.
#pragma once

#include <string>

namespace zaya {

void set_build_commit(const std::string& commit);
// "unknown" when nothing set it (tests, tools linking the libraries directly).
const std::string& build_commit();
// The release version, CMake's project(zaya VERSION ...): "0.1.0".
const char* version();

}  // namespace zaya
