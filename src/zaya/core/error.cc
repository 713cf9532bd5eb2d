#include "zaya/core/error.h"

#include <cstdio>
#include <cstdlib>

namespace zaya {
namespace {

std::string format(const std::string& message, const ErrorContext& c) {
  std::string out;
  if (!c.file.empty()) out += c.file + ": ";
  if (!c.field.empty()) out += c.field + ": ";
  out += message;
  if (!c.expected.empty() || !c.found.empty()) {
    out += " (";
    if (!c.expected.empty()) out += "expected " + c.expected;
    if (!c.expected.empty() && !c.found.empty()) out += ", ";
    if (!c.found.empty()) out += "found " + c.found;
    out += ")";
  }
  return out;
}

}  // namespace

Error::Error(const std::string& message, ErrorContext context)
    : std::runtime_error(format(message, context)), message_(message), context_(std::move(context)) {}

namespace detail {
void assert_failed(const char* file, int line, const char* cond, const std::string& msg) {
  std::fprintf(stderr, "zaya: internal error at %s:%d: assertion '%s' failed%s%s\n", file, line, cond,
               msg.empty() ? "" : ": ", msg.c_str());
  std::abort();
}
}  // namespace detail

}  // namespace zaya
