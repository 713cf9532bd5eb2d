// The one error story (docs/CONTRIBUTING.md): user-facing failures throw zaya::Error, whose
// message names the file, the field and what was expected versus found. Internal invariants use
// ZAYA_ASSERT, which aborts with the location: those are bugs, not user errors.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace zaya {

struct ErrorContext {
  std::string file;      // the file being read, if any
  std::string field;     // the key, tensor name or flag at fault
  std::string expected;  // what a valid value looks like
  std::string found;     // what was there instead
};

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, ErrorContext context = {});
  const ErrorContext& context() const { return context_; }
  const std::string& message() const { return message_; }

 private:
  std::string message_;
  ErrorContext context_;
};

// Concatenates anything that streams into one string: str("shape ", s, " at ", i).
template <class... Args>
std::string str(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

namespace detail {
[[noreturn]] void assert_failed(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace detail

}  // namespace zaya

// User-facing check: throws zaya::Error with the streamed message.
#define ZAYA_CHECK(cond, ...)                                        \
  do {                                                               \
    if (!(cond)) throw ::zaya::Error(::zaya::str(__VA_ARGS__));      \
  } while (0)

// Internal invariant: a failure is a bug in zaya. Kept in release builds (cheap, and a wrong
// answer is worse than an abort).
#define ZAYA_ASSERT(cond, ...)                                                         \
  do {                                                                                 \
    if (!(cond)) ::zaya::detail::assert_failed(__FILE__, __LINE__, #cond, ::zaya::str("" __VA_ARGS__)); \
  } while (0)
