#include "zaya/core/build_info.h"

namespace zaya {
namespace {
std::string& commit_slot() {
  static std::string commit = "unknown";
  return commit;
}
}  // namespace

void set_build_commit(const std::string& commit) { commit_slot() = commit.empty() ? "unknown" : commit; }
const std::string& build_commit() { return commit_slot(); }
const char* version() { return ZAYA_VERSION; }

}  // namespace zaya
