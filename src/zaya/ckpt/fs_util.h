// Durable file-system steps for the checkpoint commit protocol (docs/checkpoint-format.md).
//
// A rename is atomic but not durable until the directory holding it is fsynced, and a file's
// data is not durable until the file is fsynced; the helpers here do both, and throw zaya::Error
// naming the path and errno on failure.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace zaya::ckpt {

namespace fs = std::filesystem;

// Writes all of `n` bytes to `fd`, in pieces of at most 64 MiB, retrying on EINTR / short writes.
void write_all(int fd, const void* data, size_t n, const fs::path& what);
void fsync_path(const fs::path& path);  // a file or a directory
// rename(2) from -> to (replacing `to` if it is a file), then fsync of to's parent directory.
void atomic_rename(const fs::path& from, const fs::path& to);
// Writes `contents` to path.tmp, fsyncs it, renames it over `path`, fsyncs the directory.
void write_file_atomic(const fs::path& path, const std::string& contents);
std::string read_small_file(const fs::path& path, size_t max_bytes = 1 << 20);

// "step_0000042" (at least 7 digits); parse returns the step for such a name (no .tmp suffix).
std::string step_dir_name(int64_t step);
std::optional<int64_t> parse_step_dir_name(const std::string& name);

// Removes every entry of `run_dir` whose name ends in ".tmp" (half-written checkpoints, a
// `latest.tmp`, checkpoints being deleted). Returns what it removed.
std::vector<fs::path> remove_leftover_tmp(const fs::path& run_dir);

// Committed checkpoint steps under run_dir, ascending.
std::vector<int64_t> list_steps(const fs::path& run_dir);

// Retention: keep the newest `keep_last` (>= 1) and every step that is a multiple of
// `keep_every` (0 = none kept permanently); `protect` (the step `latest` names) is never deleted.
struct RetentionPolicy {
  int keep_last = 3;
  int64_t keep_every = 0;
};
std::vector<int64_t> steps_to_delete(const std::vector<int64_t>& steps, const RetentionPolicy& policy,
                                     std::optional<int64_t> protect);
// Deletes what the policy says, each directory first renamed to <name>.deleting.tmp so a kill
// half-way through leaves a .tmp that the next start removes, never a half-deleted step_N.
std::vector<int64_t> apply_retention(const fs::path& run_dir, const RetentionPolicy& policy);

// Moves the step directories `steps` of run_dir into a new folder run_dir/<prefix>-<UTC time>/,
// each by one atomic rename, and returns the folder. Nothing is deleted: a checkpoint that a rewind
// passes over, or one that failed verification, may still be wanted. The folder's name does not
// parse as a step directory, so list_steps and resume never see what it holds.
fs::path move_steps_aside(const fs::path& run_dir, const std::vector<int64_t>& steps, const std::string& prefix);

// Rewinding (Aegis after a NaN, or a user resuming from an older checkpoint): points `latest` at
// `step` (which must exist), then moves every newer step directory into run_dir/rewound-<time>/
// (move_steps_aside), so the re-run can save those steps again. Returns the moved steps.
std::vector<int64_t> rewind_to(const fs::path& run_dir, int64_t step);

// A directory that something new may claim as a whole (an import's run directory): absent, or an
// empty directory. Anything else is a zaya::Error naming `dir` and what it holds, so a run already
// there (its `latest`, checkpoints, metrics) is never repointed or mixed with the new one.
void require_new_directory(const fs::path& dir, const std::string& what);

// The step directory `latest` names (run_dir/latest holds e.g. "step_0000042"), if any.
std::optional<fs::path> read_latest(const fs::path& run_dir);

}  // namespace zaya::ckpt
