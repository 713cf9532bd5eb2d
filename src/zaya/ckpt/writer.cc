#include "zaya/ckpt/writer.h"

#include <chrono>
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

// Writes rank `rank`'s file into `dir` and records its chunks in `m`.
uint64_t write_rank(const fs::path& dir, int rank, const std::vector<SaveItem>& items, Manifest& m) {
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
  // add ~20% to a write at disk speed (~1.4 GB/s measured here).
  auto crcs = std::async(std::launch::async, [&entries] {
    std::vector<uint32_t> out;
    for (const auto& e : entries) out.push_back(crc32c(e.data, e.nbytes));
    return out;
  });
  StWritten w;
  try {
    w = write_safetensors(dir / fname, entries, {{"format", "zaya-checkpoint"}, {"rank", std::to_string(rank)}});
  } catch (...) {
    crcs.wait();  // it reads `entries`: let it finish before they go away
    throw;
  }
  const std::vector<uint32_t> checksums = crcs.get();
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
                   const nlohmann::json& state, const RetentionPolicy& retention, int pause_ms, uint64_t* bytes_out) {
  ZAYA_CHECK(state.is_object(), "checkpoint save: state must be a JSON object");
  ZAYA_CHECK(!ranks.empty(), "checkpoint save: no ranks");
  const std::string name = step_dir_name(step);
  const fs::path final_dir = run_dir / name;
  const fs::path tmp_dir = run_dir / (name + ".tmp");
  std::error_code ec;
  ZAYA_CHECK(!fs::exists(final_dir, ec), "checkpoint save: ", final_dir.string(),
             " already exists (after resuming from an older checkpoint, call rewind_to(run_dir, step) to discard newer ones)");
  fs::create_directories(run_dir, ec);
  fs::remove_all(tmp_dir, ec);
  fs::create_directory(tmp_dir, ec);
  if (ec) throw Error(str("cannot create directory: ", ec.message()), {.file = tmp_dir.string()});

  Manifest m;
  m.step = step;
  m.world_size = static_cast<int>(ranks.size());
  m.state = state;
  uint64_t bytes = 0;
  for (size_t r = 0; r < ranks.size(); ++r) bytes += write_rank(tmp_dir, static_cast<int>(r), ranks[r], m);
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
  for (int64_t s : apply_retention(run_dir, retention)) log_debug("checkpoint retention: deleted ", step_dir_name(s));
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
  return save_impl(run_dir, step, ranks, state, retention, 0, nullptr);
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

void CheckpointWriter::wait() {
  join_background();
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

  // Snapshot: one staging block, 64-byte-aligned slots, reused while it is large enough.
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
  parallel_copy(pieces);
  staged_state_ = state;
  const double snap = seconds_since(t1);

  pending_ = SaveStats{.step = step, .wait_previous_s = waited, .snapshot_s = snap, .stall_s = seconds_since(t0)};
  thread_ = std::thread([this, step] {
    try {
      const auto tw = std::chrono::steady_clock::now();
      uint64_t bytes = 0;
      save_impl(run_dir_, step, {staged_}, staged_state_, options_.retention, options_.test_pause_before_commit_ms, &bytes);
      pending_.write_s = seconds_since(tw);
      pending_.bytes = bytes;
      log_info("checkpoint: saved ", step_dir_name(step), ": ", bytes / 1e6, " MB, stall ", pending_.stall_s * 1e3,
               " ms (wait ", pending_.wait_previous_s * 1e3, " ms + snapshot ", pending_.snapshot_s * 1e3,
               " ms), write ", pending_.write_s, " s = ", pending_.write_gbps(), " GB/s");
    } catch (...) {
      error_ = std::current_exception();
    }
  });
  return pending_.stall_s;
}

}  // namespace zaya::ckpt
