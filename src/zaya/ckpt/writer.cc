#include "zaya/ckpt/writer.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <future>
#include <map>

#include "zaya/ckpt/checksum.h"
#include "zaya/ckpt/safetensors.h"
#include "zaya/core/error.h"
#include "zaya/core/log.h"

namespace zaya::ckpt {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Resolved {
  const SaveItem* item;
  std::vector<int64_t> global_shape;
  std::vector<int64_t> offsets;
};

// Fills in defaults (whole tensor) and checks the chunk lies inside its global tensor.
Resolved resolve(const SaveItem& it) {
  ZAYA_CHECK(it.tensor.defined(), "checkpoint save: tensor '", it.name, "' is undefined");
  Resolved r{&it, it.global_shape, it.offsets};
  const int nd = it.tensor.ndim();
  if (r.global_shape.empty() && nd > 0) r.global_shape.assign(it.tensor.shape().begin(), it.tensor.shape().end());
  if (r.offsets.empty()) r.offsets.assign(r.global_shape.size(), 0);
  ZAYA_CHECK(static_cast<int>(r.global_shape.size()) == nd && static_cast<int>(r.offsets.size()) == nd,
             "checkpoint save: tensor '", it.name, "' has ", nd, " dims but global shape has ", r.global_shape.size(),
             " and offsets ", r.offsets.size());
  for (int d = 0; d < nd; ++d)
    ZAYA_CHECK(r.offsets[d] >= 0 && r.offsets[d] + it.tensor.size(d) <= r.global_shape[d], "checkpoint save: tensor '",
               it.name, "' chunk ", it.tensor.shape().str(), " at offset ", r.offsets[d], " in dim ", d,
               " lies outside its global extent ", r.global_shape[d]);
  return r;
}

// Writes rank `rank`'s file into `dir` and records its chunks in `m`. `single_thread`: in a
// forked child, where only the forking thread exists and no helper thread may be started.
uint64_t write_rank(const fs::path& dir, int rank, const std::vector<SaveItem>& items, Manifest& m, bool single_thread) {
  const std::string fname = rank_file_name(rank);
  std::vector<StEntry> entries;
  std::vector<Resolved> resolved;
  std::vector<Tensor> host;  // device tensors are copied to the host first (keeps them alive)
  for (const SaveItem& it : items) {
    resolved.push_back(resolve(it));
    Tensor t = it.tensor.device() == Device::cpu ? it.tensor : it.tensor.to(Device::cpu);
    host.push_back(t);
    entries.push_back(st_entry(it.name, t));
  }
  // Checksums run on another thread while the file is written: CRC32C (~7 GB/s) would otherwise
  // add ~20% to a write at disk speed (~1.4 GB/s measured here). The forked child computes them
  // inline (before the write: same bytes, same result).
  auto all_crcs = [&entries] {
    std::vector<uint32_t> out;
    for (const auto& e : entries) out.push_back(crc32c(e.data, e.nbytes));
    return out;
  };
  const std::map<std::string, std::string> meta{{"format", "zaya-checkpoint"}, {"rank", std::to_string(rank)}};
  StWritten w;
  std::vector<uint32_t> checksums;
  if (single_thread) {
    checksums = all_crcs();
    w = write_safetensors(dir / fname, entries, meta);
  } else {
    auto crcs = std::async(std::launch::async, all_crcs);
    try {
      w = write_safetensors(dir / fname, entries, meta);
    } catch (...) {
      crcs.wait();  // it reads `entries`: let it finish before they go away
      throw;
    }
    checksums = crcs.get();
  }
  uint64_t bytes = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const Resolved& r = resolved[i];
    TensorEntry& te = m.tensors[items[i].name];
    const std::string dt = entries[i].dtype;
    if (te.chunks.empty()) {
      te.dtype = dt;
      te.shape = r.global_shape;
    } else {
      ZAYA_CHECK(te.dtype == dt && te.shape == r.global_shape, "checkpoint save: tensor '", items[i].name,
                 "' has different dtypes or global shapes on different ranks");
    }
    Chunk c;
    c.file = fname;
    c.offsets = r.offsets;
    c.shape = entries[i].shape;
    c.byte_begin = w.ranges[i].first;
    c.byte_end = w.ranges[i].second;
    c.checksum = checksums[i];
    te.chunks.push_back(std::move(c));
    bytes += entries[i].nbytes;
  }
  m.files.push_back({.name = fname, .rank = rank, .bytes = w.file_bytes});
  return bytes;
}

fs::path save_impl(const fs::path& run_dir, int64_t step, const std::vector<std::vector<SaveItem>>& ranks,
                   const nlohmann::json& state, const RetentionPolicy& retention, int pause_ms, uint64_t* bytes_out,
                   bool in_child) {
  ZAYA_CHECK(state.is_object(), "checkpoint save: state must be a JSON object");
  ZAYA_CHECK(!ranks.empty(), "checkpoint save: no ranks");
  const std::string name = step_dir_name(step);
  const fs::path final_dir = run_dir / name;
  const fs::path tmp_dir = run_dir / (name + ".tmp");
  std::error_code ec;
  // A trainer never gets here with a newer checkpoint in its locked run directory (train/resume.h
  // refuses or rewinds at start); a save beside another writer, or a second save of one step, does.
  ZAYA_CHECK(!fs::exists(final_dir, ec), "checkpoint save: ", final_dir.string(),
             " already exists: another process is writing this run directory, or the run was resumed from an "
             "older checkpoint without `zaya train --resume STEP_DIR --rewind`");
  fs::create_directories(run_dir, ec);
  fs::remove_all(tmp_dir, ec);
  fs::create_directory(tmp_dir, ec);
  if (ec) throw Error(str("cannot create directory: ", ec.message()), {.file = tmp_dir.string()});

  Manifest m;
  m.step = step;
  m.world_size = static_cast<int>(ranks.size());
  m.state = state;
  uint64_t bytes = 0;
  for (size_t r = 0; r < ranks.size(); ++r) bytes += write_rank(tmp_dir, static_cast<int>(r), ranks[r], m, in_child);
  if (bytes_out) *bytes_out = bytes;
  if (pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));

  // Self-check: the manifest must parse under the reader's rules (chunks tile every tensor), so
  // a save from ranks that do not cover a tensor fails here instead of committing.
  const std::string text = manifest_to_string(m);
  parse_manifest(text, (tmp_dir / "manifest.json").string());
  write_file_atomic(tmp_dir / "manifest.json", text);
  fsync_path(tmp_dir);
  atomic_rename(tmp_dir, final_dir);
  write_file_atomic(run_dir / "latest", name + "\n");
  // No logging in a forked child: the log's mutex may have been held by another thread at fork.
  for (int64_t s : apply_retention(run_dir, retention))
    if (!in_child) log_debug("checkpoint retention: deleted ", step_dir_name(s));
  return final_dir;
}

struct CopyPiece {
  char* dst;
  const char* src;
  size_t n;
};
constexpr size_t kCopyPiece = size_t{4} << 20;

// The host-to-host part of the snapshot, which is the training stall: one thread's memcpy reaches
// only a fraction of the memory bandwidth, so large snapshots use several. Plain std::threads,
// not OpenMP: a process that forks after an OpenMP region (the kill test does) hangs in libgomp.
void parallel_copy(const std::vector<CopyPiece>& pieces) {
  const size_t threads = std::min<size_t>({pieces.size(), std::max(1u, std::thread::hardware_concurrency()), 8});
  auto work = [&](size_t t) {
    for (size_t i = t; i < pieces.size(); i += threads) std::memcpy(pieces[i].dst, pieces[i].src, pieces[i].n);
  };
  if (threads <= 1) {
    if (!pieces.empty()) work(0);
    return;
  }
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
}

}  // namespace

std::string rank_file_name(int rank) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "rank_%05d.safetensors", rank);
  return buf;
}

fs::path save_checkpoint(const fs::path& run_dir, int64_t step, const std::vector<std::vector<SaveItem>>& ranks,
                         const nlohmann::json& state, const RetentionPolicy& retention) {
  return save_impl(run_dir, step, ranks, state, retention, 0, nullptr, false);
}

const char* snapshot_name(Snapshot s) {
  return s == Snapshot::fork ? "fork" : s == Snapshot::deferred ? "deferred" : "copy";
}

Snapshot parse_snapshot(const std::string& s, const std::string& what) {
  if (s == "copy") return Snapshot::copy;
  if (s == "fork") return Snapshot::fork;
  if (s == "deferred") return Snapshot::deferred;
  throw Error(str(what, ": expected 'copy', 'fork' or 'deferred', found '", s, "'"));
}

CheckpointWriter::CheckpointWriter(fs::path run_dir, WriterOptions options)
    : run_dir_(std::move(run_dir)), options_(options) {
  ZAYA_CHECK(options_.world_size == 1 && options_.rank == 0,
             "CheckpointWriter: multi-rank saves need the distributed layer (world of one for now)");
  steps_to_delete({}, options_.retention, std::nullopt);  // validates the policy up front
  std::error_code ec;
  fs::create_directories(run_dir_, ec);
  if (ec) throw Error(str("cannot create run directory: ", ec.message()), {.file = run_dir_.string()});
  for (const auto& p : remove_leftover_tmp(run_dir_)) log_info("checkpoint: removed leftover ", p.string());
}

CheckpointWriter::~CheckpointWriter() {
  try {
    wait();
  } catch (const std::exception& e) {
    log_error("checkpoint: background save failed: ", e.what());
  }
}

void CheckpointWriter::join_background() {
  if (thread_.joinable()) {
    thread_.join();
    if (!error_) last_ = pending_;
  }
}

static void log_saved(const SaveStats& s) {
  log_info("checkpoint: saved ", step_dir_name(s.step), ": ", s.bytes / 1e6, " MB, stall ", s.stall_s * 1e3, " ms (wait ",
           s.wait_previous_s * 1e3, " ms + ", s.forked ? "fork " : "snapshot ", s.snapshot_s * 1e3, " ms), write ",
           s.write_s, " s = ", s.write_gbps(), " GB/s");
}

void CheckpointWriter::reap_child(bool block) {
  if (child_ < 0) return;
  int status = 0;
  pid_t r;
  do r = ::waitpid(child_, &status, block ? 0 : WNOHANG);
  while (r < 0 && errno == EINTR);
  if (r == 0) return;  // still writing
  const int wait_errno = errno;
  // The child wrote its one message (< PIPE_BUF, so never partial) before exiting; the pipe is
  // non-blocking, so a child that died before writing gives an empty read rather than a hang.
  std::string msg;
  char buf[4096];
  for (ssize_t n; (n = ::read(child_pipe_, buf, sizeof buf)) > 0;) msg.append(buf, static_cast<size_t>(n));
  ::close(child_pipe_);
  child_pipe_ = -1;
  const std::string what = str("checkpoint save of ", step_dir_name(pending_.step), " (forked writer, pid ", child_, ")");
  child_ = -1;
  try {
    if (r < 0) throw Error(str(what, ": waitpid failed: ", std::strerror(wait_errno)));
    if (WIFSIGNALED(status))
      throw Error(str(what, ": killed by signal ", WTERMSIG(status), "; the previous checkpoint stays latest"));
    if (msg.rfind("err ", 0) == 0) throw Error(msg.substr(4));
    unsigned long long bytes = 0;
    double write_s = 0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || std::sscanf(msg.c_str(), "ok %llu %lf", &bytes, &write_s) != 2)
      throw Error(str(what, ": exited with status ", WIFEXITED(status) ? WEXITSTATUS(status) : -1, " and message '", msg, "'"));
    pending_.bytes = bytes;
    pending_.write_s = write_s;
    last_ = pending_;
    log_saved(last_);
  } catch (...) {
    error_ = std::current_exception();
  }
}

// Forks the writer; false when fork() failed (the caller falls back to a copy snapshot).
bool CheckpointWriter::fork_writer(int64_t step, const std::vector<SaveItem>& items, const nlohmann::json& state) {
  // Device tensors are not in the child's address space in any useful way: copy them to the host
  // first (host tensors are shared copy-on-write and need nothing).
  std::vector<SaveItem> snap;
  snap.reserve(items.size());
  for (const auto& it : items)
    snap.push_back({it.name, it.tensor.device() == Device::cpu ? it.tensor : it.tensor.to(Device::cpu), it.global_shape,
                    it.offsets});
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    log_warn("checkpoint: pipe() failed (", std::strerror(errno), "); using a copy snapshot");
    return false;
  }
  std::fflush(nullptr);  // nothing buffered may be written twice (by the parent and the child)
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    log_warn("checkpoint: fork() failed (", std::strerror(e), "); using a copy snapshot");
    return false;
  }
  if (pid == 0) {
    // The child: only this thread exists. Plain single-threaded I/O, no logging, no OpenMP, no
    // stdio, and it never returns into the caller: _exit() whatever happens.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);       // a killed trainer leaves no stray writer...
    if (::getppid() != parent) ::_exit(111);  // ...even if it died before the prctl
    // Ctrl-C, `timeout` and Slurm signal the whole process group: the parent decides (a parent that
    // dies of its signal takes this writer with it).
    ::signal(SIGINT, SIG_IGN);
    ::signal(SIGTERM, SIG_IGN);
    ::close(fds[0]);
    std::string msg;
    int code = 0;
    try {
      const auto tw = std::chrono::steady_clock::now();
      uint64_t bytes = 0;
      save_impl(run_dir_, step, {snap}, state, options_.retention, options_.test_pause_before_commit_ms, &bytes, true);
      msg = str("ok ", bytes, " ", seconds_since(tw));
    } catch (const std::exception& e) {
      msg = std::string("err ") + e.what();
      code = 1;
    } catch (...) {
      msg = "err checkpoint save: unknown exception in the forked writer";
      code = 1;
    }
    if (msg.size() > 3000) msg.resize(3000);  // below PIPE_BUF: one atomic write into the empty pipe
    [[maybe_unused]] ssize_t n = ::write(fds[1], msg.data(), msg.size());
    ::_exit(code);
  }
  ::close(fds[1]);
  child_ = pid;
  child_pipe_ = fds[0];
  return true;
}

void CheckpointWriter::wait() {
  join_background();
  reap_child();
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void CheckpointWriter::poll() {
  if (thread_.joinable()) {
    // error_ belongs to the thread until it is joined; one save is in flight at a time, so no
    // child can be running beside it.
    if (!thread_done_.load(std::memory_order_acquire)) return;
    join_background();
  }
  reap_child(/*block=*/false);
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

double CheckpointWriter::save(int64_t step, const std::vector<SaveItem>& items, const nlohmann::json& state) {
  const auto t0 = std::chrono::steady_clock::now();
  wait();
  const double waited = seconds_since(t0);
  ZAYA_CHECK(state.is_object(), "checkpoint save: state must be a JSON object");
  for (const auto& it : items) ZAYA_CHECK(it.tensor.defined(), "checkpoint save: tensor '", it.name, "' is undefined");

  if (options_.snapshot == Snapshot::fork) {
    const auto t1 = std::chrono::steady_clock::now();
    pending_ = SaveStats{.step = step, .wait_previous_s = waited};
    if (fork_writer(step, items, state)) {
      pending_.snapshot_s = seconds_since(t1);
      pending_.forked = true;
      pending_.stall_s = seconds_since(t0);
      return pending_.stall_s;
    }
  }

  // Copy snapshot: one staging block, 64-byte-aligned slots, reused while it is large enough.
  size_t need = 0;
  for (const auto& it : items) {
    ZAYA_CHECK(it.tensor.defined(), "checkpoint save: tensor '", it.name, "' is undefined");
    need += (it.tensor.nbytes() + 63) / 64 * 64;
  }
  if (!staging_ || staging_->bytes < need) staging_ = allocate_storage(std::max<size_t>(need, 64), Device::cpu);
  const auto t1 = std::chrono::steady_clock::now();
  staged_.clear();
  size_t off = 0;
  std::vector<CopyPiece> pieces;
  for (const auto& it : items) {
    Tensor copy = Tensor::over(staging_, off, it.tensor.shape(), it.tensor.dtype());
    if (it.tensor.device() == Device::cpu) {
      const auto* src = static_cast<const char*>(it.tensor.raw());
      auto* dst = static_cast<char*>(copy.raw());
      for (size_t p = 0; p < it.tensor.nbytes(); p += kCopyPiece)
        pieces.push_back({dst + p, src + p, std::min(kCopyPiece, it.tensor.nbytes() - p)});
    } else {
      copy.copy_from(it.tensor);  // device to host
    }
    staged_.push_back({it.name, copy, it.global_shape, it.offsets});
    off += (it.tensor.nbytes() + 63) / 64 * 64;
  }
  staged_state_ = state;
  const bool deferred = options_.snapshot == Snapshot::deferred;
  std::promise<void> copied;
  copied_ = copied.get_future().share();
  if (!deferred) {
    parallel_copy(pieces);
    copied.set_value();
  }
  const double snap = seconds_since(t1);

  pending_ = SaveStats{.step = step, .wait_previous_s = waited, .snapshot_s = snap, .stall_s = seconds_since(t0)};
  thread_done_.store(false);
  thread_ = std::thread([this, step, deferred, pieces = std::move(pieces), copied = std::move(copied)]() mutable {
    if (deferred) {
      parallel_copy(pieces);  // a throw here cannot happen (plain memcpy); the promise is always set
      copied.set_value();
    }
    try {
      const auto tw = std::chrono::steady_clock::now();
      uint64_t bytes = 0;
      save_impl(run_dir_, step, {staged_}, staged_state_, options_.retention, options_.test_pause_before_commit_ms, &bytes,
                false);
      pending_.write_s = seconds_since(tw);
      pending_.bytes = bytes;
      log_saved(pending_);
    } catch (...) {
      error_ = std::current_exception();
    }
    thread_done_.store(true, std::memory_order_release);
  });
  return pending_.stall_s;
}

double CheckpointWriter::fence() {
  if (!copied_.valid()) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  copied_.wait();
  return seconds_since(t0);
}

}  // namespace zaya::ckpt
