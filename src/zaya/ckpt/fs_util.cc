#include "zaya/ckpt/fs_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "zaya/core/error.h"

namespace zaya::ckpt {
namespace {

[[noreturn]] void throw_errno(const char* op, const fs::path& path, int err) {
  throw Error(str(op, " failed: ", std::strerror(err)), {.file = path.string()});
}

}  // namespace

void write_all(int fd, const void* data, size_t n, const fs::path& what) {
  constexpr size_t kPiece = size_t{64} << 20;  // large writes; below Linux's 2 GiB per-call cap
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min(n, kPiece));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw_errno("write", what, errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void fsync_path(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_errno("open for fsync", path, errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) throw_errno("fsync", path, err);
}

void atomic_rename(const fs::path& from, const fs::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) throw_errno(("rename to " + to.string()).c_str(), from, errno);
  fs::path parent = to.parent_path();
  fsync_path(parent.empty() ? fs::path(".") : parent);
}

void write_file_atomic(const fs::path& path, const std::string& contents) {
  fs::path tmp = path;
  tmp += ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_errno("open", tmp, errno);
  try {
    write_all(fd, contents.data(), contents.size(), tmp);
    if (::fsync(fd) != 0) throw_errno("fsync", tmp, errno);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) throw_errno("close", tmp, errno);
  atomic_rename(tmp, path);
}

std::string read_small_file(const fs::path& path, size_t max_bytes) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw_errno("open", path, errno);
  std::string out;
  char buf[65536];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, f)) > 0) {
    out.append(buf, got);
    if (out.size() > max_bytes) {
      std::fclose(f);
      throw Error("file too large", {.file = path.string(), .expected = str("at most ", max_bytes, " bytes")});
    }
  }
  bool bad = std::ferror(f);
  std::fclose(f);
  if (bad) throw Error("read failed", {.file = path.string()});
  return out;
}

std::string step_dir_name(int64_t step) {
  ZAYA_CHECK(step >= 0, "checkpoint step must be non-negative, got ", step);
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%07lld", static_cast<long long>(step));
  return buf;
}

std::optional<int64_t> parse_step_dir_name(const std::string& name) {
  constexpr std::string_view prefix = "step_";
  if (name.size() <= prefix.size() || name.size() > prefix.size() + 18 || name.rfind(prefix, 0) != 0)
    return std::nullopt;
  int64_t v = 0;
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

std::vector<fs::path> remove_leftover_tmp(const fs::path& run_dir) {
  std::vector<fs::path> removed;
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) return removed;
  for (const auto& entry : fs::directory_iterator(run_dir)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) {
      fs::remove_all(entry.path(), ec);
      if (ec) throw Error(str("cannot remove leftover ", ec.message()), {.file = entry.path().string()});
      removed.push_back(entry.path());
    }
  }
  if (!removed.empty()) fsync_path(run_dir);
  return removed;
}

std::vector<int64_t> list_steps(const fs::path& run_dir) {
  std::vector<int64_t> steps;
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) return steps;
  for (const auto& entry : fs::directory_iterator(run_dir)) {
    if (!entry.is_directory()) continue;
    if (auto s = parse_step_dir_name(entry.path().filename().string())) steps.push_back(*s);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::vector<int64_t> steps_to_delete(const std::vector<int64_t>& steps, const RetentionPolicy& policy,
                                     std::optional<int64_t> protect) {
  ZAYA_CHECK(policy.keep_last >= 1, "retention keep_last must be >= 1 (the newest checkpoint is always kept), got ",
             policy.keep_last);
  ZAYA_CHECK(policy.keep_every >= 0, "retention keep_every must be >= 0, got ", policy.keep_every);
  std::vector<int64_t> sorted = steps;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> out;
  const size_t n = sorted.size();
  const size_t keep_from = n > static_cast<size_t>(policy.keep_last) ? n - policy.keep_last : 0;
  for (size_t i = 0; i < keep_from; ++i) {
    int64_t s = sorted[i];
    if (policy.keep_every > 0 && s % policy.keep_every == 0) continue;
    if (protect && *protect == s) continue;
    out.push_back(s);
  }
  return out;
}

std::optional<fs::path> read_latest(const fs::path& run_dir) {
  std::error_code ec;
  if (!fs::exists(run_dir / "latest", ec)) return std::nullopt;
  std::string name = read_small_file(run_dir / "latest", 4096);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ' || name.back() == '\r')) name.pop_back();
  if (!parse_step_dir_name(name))
    throw Error("`latest` does not name a checkpoint directory",
                {.file = (run_dir / "latest").string(), .expected = "step_NNNNNNN", .found = "'" + name.substr(0, 40) + "'"});
  return run_dir / name;
}

void require_new_directory(const fs::path& dir, const std::string& what) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (!fs::exists(st)) return;
  if (!fs::is_directory(st))
    throw Error(str(what, ": the path exists and is not a directory"), {.file = dir.string()});
  std::vector<std::string> names;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    names.push_back(it->path().filename().string());
    if (names.size() == 4) break;
  }
  if (ec) throw Error(str(what, ": cannot list the directory: ", ec.message()), {.file = dir.string()});
  if (names.empty()) return;
  std::sort(names.begin(), names.end());
  std::string held;
  for (size_t i = 0; i < names.size() && i < 3; ++i) held += (i ? ", " : "") + names[i];
  if (names.size() > 3) held += ", ...";
  throw Error(str(what, ": the directory is not empty (it holds ", held,
                  "); writing into it would repoint its `latest` and mix with what is there. Choose a new or "
                  "empty directory"),
              {.file = dir.string()});
}

namespace {
void delete_step(const fs::path& run_dir, int64_t s) {
  fs::path dir = run_dir / step_dir_name(s);
  fs::path tomb = run_dir / (step_dir_name(s) + ".deleting.tmp");
  atomic_rename(dir, tomb);
  std::error_code ec;
  fs::remove_all(tomb, ec);
  if (ec) throw Error(str("cannot delete old checkpoint: ", ec.message()), {.file = tomb.string()});
}
}  // namespace

fs::path move_steps_aside(const fs::path& run_dir, const std::vector<int64_t>& steps, const std::string& prefix) {
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
  // Two moves within one second get distinct folders.
  fs::path folder = run_dir / (prefix + "-" + stamp);
  for (int n = 1; ::mkdir(folder.c_str(), 0755) != 0; ++n) {
    if (errno != EEXIST || n > 1000) throw_errno("mkdir", folder, errno);
    folder = run_dir / (prefix + "-" + stamp + "-" + std::to_string(n));
  }
  fsync_path(run_dir);
  for (int64_t s : steps) {
    const std::string name = step_dir_name(s);
    if (::rename((run_dir / name).c_str(), (folder / name).c_str()) != 0)
      throw_errno(("rename to " + (folder / name).string()).c_str(), run_dir / name, errno);
  }
  fsync_path(folder);
  fsync_path(run_dir);
  return folder;
}

std::vector<int64_t> rewind_to(const fs::path& run_dir, int64_t step) {
  std::error_code ec;
  const fs::path target = run_dir / step_dir_name(step);
  if (!fs::is_regular_file(target / "manifest.json", ec))
    throw Error("cannot rewind: no committed checkpoint for that step", {.file = target.string()});
  write_file_atomic(run_dir / "latest", step_dir_name(step) + "\n");
  std::vector<int64_t> newer;
  for (int64_t s : list_steps(run_dir))
    if (s > step) newer.push_back(s);
  if (!newer.empty()) move_steps_aside(run_dir, newer, "rewound");
  return newer;
}

std::vector<int64_t> apply_retention(const fs::path& run_dir, const RetentionPolicy& policy) {
  std::optional<int64_t> protect;
  if (auto latest = read_latest(run_dir)) protect = parse_step_dir_name(latest->filename().string());
  std::vector<int64_t> doomed = steps_to_delete(list_steps(run_dir), policy, protect);
  for (int64_t s : doomed) delete_step(run_dir, s);
  return doomed;
}

}  // namespace zaya::ckpt
