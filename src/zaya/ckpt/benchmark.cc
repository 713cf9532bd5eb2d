#include "zaya/ckpt/benchmark.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "zaya/ckpt/fs_util.h"
#include "zaya/ckpt/writer.h"
#include "zaya/core/cuda_runtime.h"
#include "zaya/core/error.h"
#include "zaya/ops/optim_ops.h"

namespace zaya::ckpt {
namespace {

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Adds 1 to every element: the optimizer step that follows a save writes every parameter once.
// On a device: a scaling by 1 (one read and one write of every element), waited for.
double touch(const std::vector<SaveItem>& items) {
  const auto t0 = std::chrono::steady_clock::now();
  if (items.front().tensor.device() != Device::cpu) {
    for (const auto& it : items) ops::scale_inplace(it.tensor, 1.0f);
    cuda::synchronize();
    return since(t0);
  }
  for (const auto& it : items) {
    float* p = it.tensor.data<float>();
    for (int64_t k = 0, n = it.tensor.numel(); k < n; ++k) p[k] += 1.0f;
  }
  return since(t0);
}

// A read-only pass over every tensor, like a forward pass reading the weights: the work a deferred
// snapshot's background copy overlaps before the optimizer's fence.
double read_pass(const std::vector<SaveItem>& items) {
  const auto t0 = std::chrono::steady_clock::now();
  if (items.front().tensor.device() != Device::cpu) {  // the norm reads every element and returns to the host
    std::vector<Tensor> ts;
    for (const auto& it : items) ts.push_back(it.tensor);
    volatile double sink = ops::global_grad_norm(ts);
    (void)sink;
    return since(t0);
  }
  double sum = 0;
  for (const auto& it : items) {
    const float* p = it.tensor.data<float>();
    for (int64_t k = 0, n = it.tensor.numel(); k < n; ++k) sum += p[k];
  }
  volatile double sink = sum;
  (void)sink;
  return since(t0);
}

}  // namespace

CheckpointBenchResult benchmark_checkpoint(uint64_t size_bytes, const std::filesystem::path& dir,
                                           const std::vector<Snapshot>& snapshots, Device device) {
  ZAYA_CHECK(size_bytes >= 32, "checkpoint benchmark: size must be at least 32 bytes, got ", size_bytes);
  const fs::path work = dir / ("zaya_ckpt_bench_" + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(work, ec);
  fs::create_directories(work, ec);
  if (ec) throw Error(str("cannot create benchmark directory: ", ec.message()), {.file = work.string()});

  // 8 tensors of equal size (the last takes the remainder); non-zero bytes so no layer below can
  // cheat with sparse or compressed zeros.
  const int64_t total = static_cast<int64_t>(size_bytes / 4);
  std::vector<SaveItem> items;
  for (int i = 0; i < 8; ++i) {
    const int64_t n = i < 7 ? total / 8 : total - 7 * (total / 8);
    Tensor t = Tensor::empty({n}, DType::f32);
    float* p = t.data<float>();
    for (int64_t k = 0; k < n; ++k) p[k] = static_cast<float>((k * 2654435761u + i) % 1000003) * 1e-3f;
    items.push_back({"param." + std::to_string(i), device == Device::cpu ? t : t.to(device), {}, {}});
  }
  CheckpointBenchResult r;
  r.bytes = static_cast<uint64_t>(total) * 4;
  try {
    {  // raw sequential write + fsync of the same bytes
      const fs::path raw = work / "raw.bin";
      const auto t0 = std::chrono::steady_clock::now();
      int fd = ::open(raw.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) throw Error(str("cannot create: ", std::strerror(errno)), {.file = raw.string()});
      for (const auto& it : items) {  // the disk's rate: from host memory
        const Tensor host = it.tensor.device() == Device::cpu ? it.tensor : it.tensor.to(Device::cpu);
        write_all(fd, host.raw(), host.nbytes(), raw);
      }
      const int rc = ::fsync(fd);
      ::close(fd);
      if (rc != 0) throw Error("fsync failed", {.file = raw.string()});
      r.raw_write_s = since(t0);
      fs::remove(raw, ec);
    }
    {
      const auto t0 = std::chrono::steady_clock::now();
      save_checkpoint(work / "sync", 1, {items}, {{"bench", true}});
      r.sync_save_s = since(t0);
      fs::remove_all(work / "sync", ec);
    }
    for (Snapshot mode : snapshots) {
      // Two saves with one writer, as in training: the first also allocates and first-touches
      // the staging memory (copy); the second is the steady state every later save sees.
      const fs::path run = work / (std::string("async_") + snapshot_name(mode));
      AsyncBenchResult a;
      a.snapshot = mode;
      {
        CheckpointWriter w(run, {.snapshot = mode});
        a.first_stall_s = w.save(1, items, {{"bench", true}});
        w.wait();
        a.stall_s = w.save(2, items, {{"bench", true}});
        if (mode == Snapshot::deferred) {  // the stall is what the fence still waits after the overlap
          a.overlap_read_s = read_pass(items);
          a.stall_s += w.fence();
        }
        a.touch_during_s = touch(items);
        w.wait();
        a.write_s = w.last_stats().write_s;
        a.forked = w.last_stats().forked;
        a.touch_idle_s = touch(items);
      }
      r.async.push_back(a);
      fs::remove_all(run, ec);
    }
  } catch (...) {
    fs::remove_all(work, ec);
    throw;
  }
  fs::remove_all(work, ec);
  return r;
}

}  // namespace zaya::ckpt
