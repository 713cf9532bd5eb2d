// `zaya bench collectives`, `gemm`, `membw` and `ckpt`: command-line wiring only (`zaya bench step`
// lives in cmd_bench_step.cc).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include "cli_vocabulary.h"
#include "commands.h"
#include "model_source.h"
#include "zaya/ckpt/benchmark.h"
#include "zaya/bench/collectives.h"
#include "zaya/bench/experts_bench.h"
#include "zaya/bench/gemm_bench.h"
#include "zaya/bench/sysinfo.h"
#include "zaya/core/config.h"
#include "zaya/bench/membw.h"
#include "zaya/core/log.h"
#include "zaya/dist/communicator.h"

namespace zaya::app {
namespace {

struct CollectivesFlags {
  std::string b = "32M", e = "32M", i = "1M", op = "all_reduce", dtype = "f32", backend = "auto";
  uint64_t f = 1;
  int n = 20, w = 5, c = 1;
  double timeout_s = 300;
  std::string csv, json;
};

struct MembwFlags {
  std::string min = "1M", max = "256M", threads;
  uint64_t factor = 4;
  int n = 10;
  std::string json;
};

// The options as run, for the JSON record (the original argv is main's, not ours).
std::string describe(const CollectivesFlags& f) {
  return "zaya bench collectives -b " + f.b + " -e " + f.e + " -f " + std::to_string(f.f) + " -n " +
         std::to_string(f.n) + " -w " + std::to_string(f.w) + " -c " + std::to_string(f.c) + " --op " + f.op +
         " --dtype " + f.dtype + " --backend " + f.backend;
}

struct GemmFlags {
  std::string shapes, dtype = "bf16", backend = "cpu", out, membw, name, experts_bytes = "512M";
  std::vector<std::string> overrides;
  std::vector<int64_t> experts_tokens;
  bool sweep = false;
  int64_t tokens = 4096, min_dim = 64, max_dim = 2048, ref_dim = 2048;
  int warmup = 2, repeats = 5;
  double peak = 0;
};

int run_gemm(const GemmFlags& fl) {
  bench::GemmBenchOptions o;
  bench::ExpertsBenchOptions experts;  // with --experts-tokens: the model's experts op as decode runs it
  o.dtype = fl.dtype == "bf16" ? DType::bf16 : DType::f32;  // dtype_vocabulary() admits only these two
  o.backend = fl.backend;
  o.warmup = fl.warmup;
  o.repeats = fl.repeats;
  if (fl.shapes.empty() == !fl.sweep)
    throw Error("choose the shapes", {.field = "--shapes/--sweep", .expected = "exactly one of --shapes model:CONFIG or --sweep"});
  if (!fl.shapes.empty()) {
    if (fl.shapes.rfind("model:", 0) != 0)
      throw Error("unknown shape source", {.field = "--shapes", .expected = "model:CONFIG (a TOML run config or config.json)",
                                           .found = fl.shapes});
    const std::string path = fl.shapes.substr(6);
    model::ModelConfig c;
    if (path.size() > 5 && path.substr(path.size() - 5) == ".json") {
      c = model::ModelConfig::from_hf_json(path);
    } else {
      ConfigReader r = ConfigReader::from_file(path, fl.overrides);
      c = model::ModelConfig::from_toml(r);
    }
    o.cases = bench::model_gemm_cases(c, fl.tokens, fl.ref_dim);
    experts = bench::experts_bench_options(c, fl.experts_tokens);
  } else {
    o.cases = bench::sweep_gemm_cases(fl.min_dim, fl.max_dim);
  }
  o.validate();
  if (!fl.experts_tokens.empty()) {
    if (fl.shapes.empty())
      throw Error("--experts-tokens times a model's experts op", {.field = "--experts-tokens", .expected = "--shapes model:CONFIG"});
    experts.dtype = o.dtype;
    experts.device = fl.backend == "cuda" ? Device::cuda : Device::cpu;
    experts.warmup = fl.warmup;
    experts.repeats = fl.repeats;
    experts.min_bytes = static_cast<double>(dist::parse_size(fl.experts_bytes, "--experts-bytes"));
    experts.validate();
  }
  // Inputs of the profile are checked before the (long) timing runs.
  sizing::HardwareProfile base;
  if (!fl.out.empty() && std::filesystem::exists(fl.out)) base = sizing::load_profile(fl.out);  // extend, keep other fields
  double membw = fl.membw.empty() ? 0 : bench::membw_from_json(fl.membw);

  auto rows = bench::run_gemm_bench(o, std::cout);
  std::vector<sizing::ExpertsPoint> experts_rows;
  if (!fl.experts_tokens.empty()) experts_rows = bench::run_experts_bench(experts, std::cout);
  if (fl.out.empty()) return 0;
  sizing::HardwareProfile p = bench::profile_from_gemm(rows, o.dtype, base, fl.peak);
  bench::merge_experts_table(p, experts_rows);
  if (!fl.name.empty()) p.name = fl.name;
  if (p.name.empty()) p.name = "measured-" + fl.backend;
  if (membw > 0) p.memory_bandwidth = membw;
  // A profile with memory_bytes 0 makes `zaya size --hw` warn that every model overflows the device.
  if (p.memory_bytes <= 0) p.memory_bytes = bench::backend_memory_bytes(fl.backend);
  if (p.gpus_per_node <= 0) p.gpus_per_node = 1;
  p.source = "zaya bench gemm (" + fl.backend + ", " + fl.dtype + (fl.sweep ? ", sweep" : ", " + fl.shapes) + ")" +
             (fl.membw.empty() ? "" : " + zaya bench membw (" + fl.membw + ")") +
             (experts_rows.empty() ? "" : " + the experts op at --experts-tokens") +
             (fl.peak > 0 ? "; peak from --peak" : "; peak = best measured GEMM");
  sizing::save_profile(p, fl.out);
  std::cout << "# wrote " << fl.out << " (" << p.gemm_table.size() << " GEMM shapes";
  if (!p.experts_table.empty()) std::cout << ", " << p.experts_table.size() << " experts-op entries";
  if (p.memory_bandwidth <= 0) std::cout << "; memory_bandwidth unknown: pass --membw FILE from `zaya bench membw --json`";
  std::cout << ")\n";
  return 0;
}

int run_collectives(const CollectivesFlags& fl, const std::string& command) {
  bench::CollectivesOptions o;
  o.min_bytes = dist::parse_size(fl.b, "-b");
  o.max_bytes = dist::parse_size(fl.e, "-e");
  o.step_bytes = dist::parse_size(fl.i, "-i");
  o.step_factor = fl.f;
  o.iters = fl.n;
  o.warmup = fl.w;
  o.check = fl.c;
  o.ops = dist::parse_colls(fl.op);
  o.dtype = fl.dtype == "bf16" ? DType::bf16 : DType::f32;  // dtype_vocabulary() admits only these two
  o.csv_path = fl.csv;
  o.json_path = fl.json;
  o.command_line = command;
  o.validate();  // bad flags fail before MPI starts, on every rank alike
  ZAYA_CHECK(fl.timeout_s > 0, "--timeout-s must be positive, found ", fl.timeout_s);

  bool is_auto = false;
  dist::Backend backend = dist::parse_backend(fl.backend, "--backend", &is_auto);
  auto comm = dist::make_communicator(backend, is_auto, {.timeout_s = fl.timeout_s});
  set_log_rank(comm->rank(), comm->size());
  int wrong_tests = 0;
  for (const auto& r : bench::run_collectives(*comm, o, std::cout)) wrong_tests += (r.wrong[0] != 0) + (r.wrong[1] != 0);
  return wrong_tests ? 1 : 0;  // 1: a check failed (docs/CONTRIBUTING.md exit codes)
}

void add_bench(CLI::App& app, Commands& commands) {
  auto* bench = app.add_subcommand("bench", "Training-step, collective, GEMM, memory-bandwidth and checkpoint benchmarks");
  bench->require_subcommand(1);
  add_bench_step(*bench, commands);

  auto fl = std::make_shared<CollectivesFlags>();
  auto* coll = bench->add_subcommand("collectives", "Collective microbenchmarks in the nccl-tests format (run under mpirun)");
  coll->add_option("-b,--minbytes", fl->b, "Smallest size in bytes (K/M/G suffixes, powers of 1024)")->capture_default_str();
  coll->add_option("-e,--maxbytes", fl->e, "Largest size in bytes")->capture_default_str();
  coll->add_option("-i,--stepbytes", fl->i, "Size increment when -f is 1")->capture_default_str();
  coll->add_option("-f,--stepfactor", fl->f, "Size multiplier between tests")->capture_default_str();
  coll->add_option("-n,--iters", fl->n, "Timed iterations per test")->capture_default_str();
  coll->add_option("-w,--warmup_iters", fl->w, "Untimed iterations before each test")->capture_default_str();
  coll->add_option("-c,--check", fl->c, "Validation passes per test (0: no check)")->capture_default_str();
  coll->add_option("--op", fl->op,
                   "all_reduce, reduce_scatter, all_gather, broadcast, all_to_all, reduce_scatter_v, all_gather_v "
                   "(the variable-count forms, run with equal counts) or all")
      ->capture_default_str();
  coll->add_option("--dtype,-d", fl->dtype, "f32 or bf16 (nccl-tests' float and bfloat16 too)")
      ->transform(dtype_vocabulary())
      ->capture_default_str();
  coll->add_option("--backend", fl->backend, "auto, local, mpi or nccl")->capture_default_str();
  coll->add_option("--timeout-s,-T", fl->timeout_s, "Per-collective timeout; a rank that never arrives is named")
      ->capture_default_str();
  coll->add_option("--csv", fl->csv, "Also write the rows as CSV (rank 0)");
  coll->add_option("--json", fl->json, "Also write the rows as JSON (rank 0)");
  commands.push_back({coll, [fl] { return run_collectives(*fl, describe(*fl)); }});

  auto gf = std::make_shared<GemmFlags>();
  auto* gemm = bench->add_subcommand("gemm", "GEMM throughput versus shape; writes the GEMM table of a hardware profile");
  gemm->add_option("--shapes", gf->shapes, "model:CONFIG: every GEMM of one training step of that model");
  gemm->add_option("--set", gf->overrides, "override a config key of --shapes: model.hidden_size=1024");
  gemm->add_option("--tokens", gf->tokens, "tokens per micro-batch for --shapes")->capture_default_str();
  gemm->add_flag("--sweep", gf->sweep, "sweep M, N, K over powers of two and a few non-powers");
  gemm->add_option("--min-dim", gf->min_dim, "smallest dimension of --sweep")->capture_default_str();
  gemm->add_option("--max-dim", gf->max_dim, "largest dimension of --sweep")->capture_default_str();
  gemm->add_option("--ref-dim", gf->ref_dim, "square reference GEMM added to --shapes (0: none)")->capture_default_str();
  gemm->add_option("--dtype", gf->dtype, "f32 or bf16 inputs (f32 accumulation and output)")
      ->transform(dtype_vocabulary())
      ->capture_default_str();
  gemm->add_option("--backend", gf->backend, "cpu (oneDNN) or cuda (cuBLASLt)")->capture_default_str();
  gemm->add_option("-w,--warmup", gf->warmup, "untimed runs per shape")->capture_default_str();
  gemm->add_option("-n,--repeats", gf->repeats, "timed runs per shape; the median is reported")->capture_default_str();
  gemm->add_option("--out", gf->out, "write (or extend) a hardware profile JSON");
  gemm->add_option("--membw", gf->membw, "a `zaya bench membw --json` file: the profile's memory_bandwidth");
  gemm->add_option("--peak", gf->peak, "datasheet peak FLOP/s for the profile (default: the best measured)");
  gemm->add_option("--name", gf->name, "profile name");
  gemm->add_option("--experts-tokens", gf->experts_tokens,
                   "also time the model's experts op (ops::experts_forward) at these tokens per call, comma-separated "
                   "(decode's batch sizes): the profile's experts_table")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  gemm->add_option("--experts-bytes", gf->experts_bytes,
                   "weights the experts timing cycles through (layers of the model's experts), past the caches")
      ->capture_default_str();
  commands.push_back({gemm, [gf] { return run_gemm(*gf); }});

  auto mf = std::make_shared<MembwFlags>();
  auto* mem = bench->add_subcommand("membw", "STREAM-style memory bandwidth versus array size and threads");
  mem->add_option("--min-bytes", mf->min, "Smallest array size in bytes (per array)")->capture_default_str();
  mem->add_option("--max-bytes", mf->max, "Largest array size in bytes (per array)")->capture_default_str();
  mem->add_option("--factor", mf->factor, "Size multiplier between rows")->capture_default_str();
  mem->add_option("--threads", mf->threads, "Comma-separated thread counts (default: 1 and all)");
  mem->add_option("-n,--iters", mf->n, "Iterations; the best is reported")->capture_default_str();
  mem->add_option("--json", mf->json, "Also write the rows as JSON");
  commands.push_back({mem, [mf] {
                        bench::MembwOptions o;
                        o.min_bytes = dist::parse_size(mf->min, "--min-bytes");
                        o.max_bytes = dist::parse_size(mf->max, "--max-bytes");
                        o.factor = mf->factor;
                        o.iters = mf->n;
                        if (!mf->threads.empty()) o.threads = bench::parse_int_list(mf->threads, "--threads");
                        o.json_path = mf->json;
                        auto rows = bench::run_membw(o, std::cout);
                        for (const auto& r : rows)
                          if (!r.valid) return 1;
                        return 0;
                      }});

  auto ck_size = std::make_shared<std::string>("2GiB");
  auto ck_dir = std::make_shared<std::string>();
  auto ck_snap = std::make_shared<std::string>("all");
  auto* ck = bench->add_subcommand("ckpt", "Checkpoint save: synchronous time, async stall, write GB/s vs raw disk bandwidth");
  ck->add_option("--size", *ck_size, "checkpoint size (K/M/G suffixes, powers of 1024; e.g. 2GiB)")->capture_default_str();
  ck->add_option("--dir", *ck_dir,
                 "directory on the file system to measure, e.g. the one runs are written to (a scratch "
                 "subdirectory is removed afterwards; default: the system temporary directory, $TMPDIR or /tmp, "
                 "which may be memory rather than disk)");
  ck->add_option("--snapshot", *ck_snap, "async writer snapshot mode(s) to measure: copy, fork, deferred or all")->capture_default_str();
  auto ck_device = std::make_shared<std::string>("cpu");
  ck->add_option("--device", *ck_device,
                 "where the tensors live: cpu, or cuda (a GPU run's saves: the copy to the host is part of the "
                 "stall; fork copies first, like copy)")
      ->capture_default_str();
  commands.push_back({ck, [ck_size, ck_dir, ck_snap, ck_device] {
                        const Device device = parse_device_flag(*ck_device);
                        std::string size = *ck_size;
                        if (size.size() > 3 && size.substr(size.size() - 2) == "iB") size.resize(size.size() - 2);  // 2GiB -> 2G
                        uint64_t bytes = dist::parse_size(size, "--size");
                        ZAYA_CHECK(bytes >= (1u << 20), "--size: at least 1 MiB, found ", *ck_size);
                        std::vector<ckpt::Snapshot> modes;
                        if (*ck_snap == "all" || *ck_snap == "both")
                          modes = {ckpt::Snapshot::copy, ckpt::Snapshot::fork, ckpt::Snapshot::deferred};
                        else
                          modes = {ckpt::parse_snapshot(*ck_snap, "--snapshot (or 'all')")};
                        const std::string dir =
                            ck_dir->empty() ? std::filesystem::temp_directory_path().string() : *ck_dir;
                        std::filesystem::create_directories(dir);
                        ckpt::CheckpointBenchResult r = ckpt::benchmark_checkpoint(bytes, dir, modes, device);
                        std::printf("# zaya bench ckpt: %.2f GiB in 8 f32 tensors on %s, directory %s\n",
                                    static_cast<double>(r.bytes) / (1u << 30), std::string(device_name(device)).c_str(),
                                    dir.c_str());
                        std::printf("%-40s %10s %10s\n", "#", "seconds", "GB/s");
                        std::printf("%-40s %10.3f %10.3f\n", "raw sequential write + fsync", r.raw_write_s, r.raw_gbps());
                        std::printf("%-40s %10.3f %10.3f\n", "synchronous save (commit incl.)", r.sync_save_s, r.sync_gbps());
                        for (const auto& a : r.async) {
                          const std::string m = std::string("async ") + ckpt::snapshot_name(a.snapshot) +
                                                (a.snapshot == ckpt::Snapshot::fork && !a.forked ? " (FELL BACK TO COPY)" : "");
                          std::printf("%-40s %10.3f %10s\n", (m + ": stall, first save").c_str(), a.first_stall_s, "-");
                          std::printf("%-40s %10.3f %10s\n", (m + ": stall, later saves").c_str(), a.stall_s, "-");
                          std::printf("%-40s %10.3f %10.3f\n", (m + ": background write").c_str(), a.write_s, r.gbps(a.write_s));
                          std::printf("%-40s %10.3f %10s\n", (m + ": next-step write pass").c_str(), a.touch_during_s, "-");
                          std::printf("%-40s %10.3f %10s\n", (m + ": same pass, no save").c_str(), a.touch_idle_s, "-");
                          if (a.snapshot == ckpt::Snapshot::deferred)
                            std::printf("%-40s %10.3f %10s\n", (m + ": read pass before the fence").c_str(), a.overlap_read_s, "-");
                        }
                        for (const auto& a : r.async) {
                          std::printf("%s: stall / synchronous save %.4f  (bar: <= 0.05); with the next step's extra cost %.4f\n",
                                      ckpt::snapshot_name(a.snapshot), a.stall_s / r.sync_save_s,
                                      (a.stall_s + std::max(0.0, a.hidden_s())) / r.sync_save_s);
                          std::printf("%s: save write / raw bandwidth %.3f (synchronous), %.3f (async)  (bar: >= 0.70)\n",
                                      ckpt::snapshot_name(a.snapshot), r.sync_gbps() / r.raw_gbps(), r.gbps(a.write_s) / r.raw_gbps());
                        }
                        return 0;
                      }});
}

}  // namespace
}  // namespace zaya::app

ZAYA_COMMAND(bench, zaya::app::add_bench);
