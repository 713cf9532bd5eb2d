#include "zaya/ckpt/writer.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <future>

#include "zaya/core/error.h"
#include "zaya/core/log.h"

namespace zaya::ckpt {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A checkpoint whose rank files are all written by this process (a world of one, or tools and
// tests writing several ranks): the whole protocol in one place, step_N.tmp prepared here.
fs::path save_impl(const fs::path& run_dir, int64_t step, const std::vector<std::vector<SaveItem>>& ranks,
                   const nlohmann::json& state, const RetentionPolicy& retention, int pause_ms, uint64_t* bytes_out,
                   bool in_child) {
  ZAYA_CHECK(state.is_object(), "checkpoint save: state must be a JSON object");
  ZAYA_CHECK(!ranks.empty(), "checkpoint save: no ranks");
  const fs::path tmp_dir = prepare_step_dir(run_dir, step);
  std::vector<RankChunks> written;
  uint64_t bytes = 0;
  for (size_t r = 0; r < ranks.size(); ++r) {
    written.push_back(write_rank_file(tmp_dir, static_cast<int>(r), ranks[r], in_child));
    bytes += written.back().tensor_bytes;
  }
  if (bytes_out) *bytes_out = bytes;
  if (pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
  const Manifest m =
      compose_manifest(step, static_cast<int>(ranks.size()), state, written, (tmp_dir / "manifest.json").string());
  // No logging in a forked child: the log's mutex may have been held by another thread at fork.
  return commit_step_dir(run_dir, m, retention, /*quiet=*/in_child);
}

// One rank's part of a save of a world > 1, in the background (thread or forked child): no
// communication, only files (rank_save.h). save() has had rank 0 prepare step_N.tmp and has
// ordered every rank after that with the barrier. Returns this rank's tensor bytes.
uint64_t save_rank_part(const fs::path& run_dir, int64_t step, const std::vector<SaveItem>& items,
                        const nlohmann::json& state, const WriterOptions& o, bool in_child, double* gather_s) {
  const fs::path tmp_dir = run_dir / (step_dir_name(step) + ".tmp");
  std::error_code ec;
  ZAYA_CHECK(fs::is_directory(tmp_dir, ec), "checkpoint save of ", step_dir_name(step), " (rank ", o.rank, " of ",
             o.world_size, "): ", tmp_dir.string(), " does not exist: rank 0 did not prepare this save (its error says why)");
  if (o.rank != 0) {
    try {
      const RankChunks rc = write_rank_file(tmp_dir, o.rank, items, in_child);
      if (o.test_pause_before_commit_ms > 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(o.test_pause_before_commit_ms));
      write_chunk_list(tmp_dir, rc, step, o.world_size);  // last: the rank file is durable by now
      return rc.tensor_bytes;
    } catch (const std::exception& e) {
      write_rank_error(tmp_dir, o.rank, e.what());  // rank 0 fails at once with the cause
      throw;
    }
  }
  RankChunks own = write_rank_file(tmp_dir, 0, items, in_child);
  const uint64_t bytes = own.tensor_bytes;
  if (o.test_pause_before_commit_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.test_pause_before_commit_ms));
  const auto tg = std::chrono::steady_clock::now();
  std::vector<RankChunks> all = gather_chunk_lists(tmp_dir, step, o.world_size, o.gather_timeout_s);
  if (gather_s) *gather_s = seconds_since(tg);
  all[0] = std::move(own);
  const Manifest m = compose_manifest(step, o.world_size, state, all, (tmp_dir / "manifest.json").string());
  commit_step_dir(run_dir, m, o.retention, /*quiet=*/in_child);
  return bytes;
}

// The background part of CheckpointWriter::save, for any world size.
uint64_t write_save(const fs::path& run_dir, int64_t step, const std::vector<SaveItem>& items, const nlohmann::json& state,
                    const WriterOptions& o, bool in_child, double* gather_s) {
  if (o.world_size == 1) {
    uint64_t bytes = 0;
    save_impl(run_dir, step, {items}, state, o.retention, o.test_pause_before_commit_ms, &bytes, in_child);
    return bytes;
  }
  return save_rank_part(run_dir, step, items, state, o, in_child, gather_s);
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
  ZAYA_CHECK(options_.world_size >= 1 && options_.rank >= 0 && options_.rank < options_.world_size,
             "CheckpointWriter: rank ", options_.rank, " is not a rank of a world of ", options_.world_size);
  ZAYA_CHECK(options_.world_size == 1 || options_.barrier,
             "CheckpointWriter: a world of ", options_.world_size,
             " needs WriterOptions::barrier (a barrier over the ranks, e.g. the communicator's): save() orders the ranks "
             "with it");
  ZAYA_CHECK(options_.gather_timeout_s > 0, "CheckpointWriter: gather_timeout_s must be > 0, got ",
             options_.gather_timeout_s);
  steps_to_delete({}, options_.retention, std::nullopt);  // validates the policy up front
  std::error_code ec;
  fs::create_directories(run_dir_, ec);
  if (ec) throw Error(str("cannot create run directory: ", ec.message()), {.file = run_dir_.string()});
  // Only rank 0 clears debris: another rank doing it could remove files a faster rank is writing.
  if (options_.rank == 0)
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

static void log_saved(const SaveStats& s, const WriterOptions& o) {
  const std::string stall = str("stall ", s.stall_s * 1e3, " ms (wait ", s.wait_previous_s * 1e3, " ms + ",
                                o.world_size > 1 ? str("barriers ", s.barrier_s * 1e3, " ms + ") : std::string(),
                                s.forked ? "fork " : "snapshot ", s.snapshot_s * 1e3, " ms), write ", s.write_s, " s = ",
                                s.write_gbps(), " GB/s");
  if (o.world_size == 1)
    log_info("checkpoint: saved ", step_dir_name(s.step), ": ", s.bytes / 1e6, " MB, ", stall);
  else if (o.rank == 0)
    log_info("checkpoint: saved ", step_dir_name(s.step), " (", o.world_size, " ranks; rank 0 wrote ", s.bytes / 1e6,
             " MB and waited ", s.gather_s, " s for the others' chunk lists), ", stall);
  else
    log_info("checkpoint: rank ", o.rank, " wrote its part of ", step_dir_name(s.step), ": ", s.bytes / 1e6, " MB, ", stall);
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
    double write_s = 0, gather_s = 0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
        std::sscanf(msg.c_str(), "ok %llu %lf %lf", &bytes, &write_s, &gather_s) != 3)
      throw Error(str(what, ": exited with status ", WIFEXITED(status) ? WEXITSTATUS(status) : -1, " and message '", msg, "'"));
    pending_.bytes = bytes;
    pending_.write_s = write_s;
    pending_.gather_s = gather_s;
    last_ = pending_;
    log_saved(last_, options_);
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
      double gather_s = 0;
      const uint64_t bytes = write_save(run_dir_, step, snap, state, options_, /*in_child=*/true, &gather_s);
      msg = str("ok ", bytes, " ", seconds_since(tw), " ", gather_s);
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

double CheckpointWriter::order_ranks(int64_t step) {
  if (options_.world_size == 1) return 0;  // save_impl prepares step_N.tmp in the background
  const auto t0 = std::chrono::steady_clock::now();
  // Every rank's previous save is finished (wait() above) once all have arrived: no write of an
  // earlier attempt can still be going into the directory rank 0 is about to clear.
  options_.barrier();
  std::exception_ptr failed;
  if (options_.rank == 0) {
    try {
      prepare_step_dir(run_dir_, step);
    } catch (...) {
      failed = std::current_exception();  // raised after the barrier, which the other ranks are already in
    }
  }
  // step_N.tmp is fresh before any rank writes into it. When rank 0's prepare failed the others
  // find no directory and their background write fails with a message that points at rank 0.
  options_.barrier();
  if (failed) std::rethrow_exception(failed);
  return seconds_since(t0);
}

void CheckpointWriter::wait_committed(double timeout_s) {
  wait();
  if (options_.world_size > 1 && options_.rank != 0 && last_.step >= 0) wait_for_latest(run_dir_, last_.step, timeout_s);
}

double CheckpointWriter::save(int64_t step, const std::vector<SaveItem>& items, const nlohmann::json& state) {
  const auto t0 = std::chrono::steady_clock::now();
  wait();
  const double waited = seconds_since(t0);
  ZAYA_CHECK(state.is_object(), "checkpoint save: state must be a JSON object");
  for (const auto& it : items) ZAYA_CHECK(it.tensor.defined(), "checkpoint save: tensor '", it.name, "' is undefined");
  const double barrier_s = order_ranks(step);

  if (options_.snapshot == Snapshot::fork) {
    const auto t1 = std::chrono::steady_clock::now();
    pending_ = SaveStats{.step = step, .wait_previous_s = waited, .barrier_s = barrier_s};
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
  // Device tensors are copied into page-locked memory, at the link's full rate.
  const bool from_device = std::any_of(items.begin(), items.end(), [](const SaveItem& it) { return it.tensor.device() != Device::cpu; });
  if (!staging_ || staging_->bytes < need || staging_->pinned != from_device)
    staging_ = from_device ? allocate_pinned_storage(std::max<size_t>(need, 64))
                           : allocate_storage(std::max<size_t>(need, 64), Device::cpu);
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

  pending_ = SaveStats{
      .step = step, .wait_previous_s = waited, .snapshot_s = snap, .barrier_s = barrier_s, .stall_s = seconds_since(t0)};
  thread_done_.store(false);
  // The save in flight keeps the options it started with: a later set_test_pause_before_commit_ms
  // is for the saves after it (reading options_ from this thread would also race with that write).
  thread_ = std::thread([this, step, deferred, options = options_, pieces = std::move(pieces),
                         copied = std::move(copied)]() mutable {
    if (deferred) {
      parallel_copy(pieces);  // a throw here cannot happen (plain memcpy); the promise is always set
      copied.set_value();
    }
    try {
      const auto tw = std::chrono::steady_clock::now();
      pending_.bytes = write_save(run_dir_, step, staged_, staged_state_, options, /*in_child=*/false, &pending_.gather_s);
      pending_.write_s = seconds_since(tw);
      log_saved(pending_, options);
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
