// Checkpoint-layer microbenchmarks: checksum speed, header parsing, the reshard copy, and a whole
// save (synchronous, async stall, raw write bandwidth) of 64 MiB in the system temp directory.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <vector>

#include "zaya/ckpt/benchmark.h"
#include "zaya/ckpt/checksum.h"
#include "zaya/ckpt/reader.h"
#include "zaya/ckpt/safetensors.h"

namespace {

using namespace zaya::ckpt;

void BM_Crc32c(benchmark::State& state) {
  std::vector<unsigned char> buf(static_cast<size_t>(state.range(0)), 0x5a);
  for (auto _ : state) benchmark::DoNotOptimize(crc32c(buf.data(), buf.size()));
  state.SetBytesProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_Crc32c)->Arg(1 << 12)->Arg(1 << 24);

void BM_CopyBoxRows(benchmark::State& state) {
  // A [4096, 1024] f32 chunk; copy the middle half of its rows and columns.
  const int64_t R = 4096, C = 1024;
  std::vector<float> src(R * C, 1.0f), dst(R / 2 * C / 2);
  CopyOp op{0, {R / 4, C / 4}, {R / 2, C / 2}};
  for (auto _ : state) {
    copy_box(reinterpret_cast<const std::byte*>(src.data()), {0, 0}, {R, C}, reinterpret_cast<std::byte*>(dst.data()),
             {R / 4, C / 4}, {R / 2, C / 2}, op, 4);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * int64_t(dst.size()) * 4);
}
BENCHMARK(BM_CopyBoxRows);

void BM_SaveCheckpoint(benchmark::State& state) {
  CheckpointBenchResult r;
  for (auto _ : state)
    r = benchmark_checkpoint(uint64_t{64} << 20, std::filesystem::temp_directory_path(), {Snapshot::deferred});
  state.counters["raw_GBps"] = r.raw_gbps();
  state.counters["sync_GBps"] = r.sync_gbps();
  state.counters["async_GBps"] = r.gbps(r.async.at(0).write_s);
  state.counters["async_stall_ms"] = r.async.at(0).stall_s * 1e3;
}
BENCHMARK(BM_SaveCheckpoint)->Iterations(2)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
