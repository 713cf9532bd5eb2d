// `zaya bench collectives` and `zaya bench membw`: command-line wiring only.
#include <iostream>
#include <memory>
#include <string>

#include "commands.h"
#include "zaya/bench/collectives.h"
#include "zaya/bench/membw.h"
#include "zaya/core/log.h"
#include "zaya/dist/communicator.h"

namespace zaya::app {
namespace {

struct CollectivesFlags {
  std::string b = "32M", e = "32M", i = "1M", op = "all_reduce", dtype = "float", backend = "auto";
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
  if (fl.dtype == "float") o.dtype = DType::f32;
  else if (fl.dtype == "bfloat16") o.dtype = DType::bf16;
  else throw Error("unknown data type", {.field = "--dtype", .expected = "float or bfloat16", .found = fl.dtype});
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
  auto* bench = app.add_subcommand("bench", "Collective and memory-bandwidth benchmarks");
  bench->require_subcommand(1);

  auto fl = std::make_shared<CollectivesFlags>();
  auto* coll = bench->add_subcommand("collectives", "Collective microbenchmarks in the nccl-tests format (run under mpirun)");
  coll->add_option("-b,--minbytes", fl->b, "Smallest size in bytes (K/M/G suffixes, powers of 1024)")->capture_default_str();
  coll->add_option("-e,--maxbytes", fl->e, "Largest size in bytes")->capture_default_str();
  coll->add_option("-i,--stepbytes", fl->i, "Size increment when -f is 1")->capture_default_str();
  coll->add_option("-f,--stepfactor", fl->f, "Size multiplier between tests")->capture_default_str();
  coll->add_option("-n,--iters", fl->n, "Timed iterations per test")->capture_default_str();
  coll->add_option("-w,--warmup_iters", fl->w, "Untimed iterations before each test")->capture_default_str();
  coll->add_option("-c,--check", fl->c, "Validation passes per test (0: no check)")->capture_default_str();
  coll->add_option("--op", fl->op, "all_reduce, reduce_scatter, all_gather, broadcast, all_to_all or all")
      ->capture_default_str();
  coll->add_option("--dtype,-d", fl->dtype, "float or bfloat16")->capture_default_str();
  coll->add_option("--backend", fl->backend, "auto, local, mpi or nccl")->capture_default_str();
  coll->add_option("--timeout-s,-T", fl->timeout_s, "Per-collective timeout; a rank that never arrives is named")
      ->capture_default_str();
  coll->add_option("--csv", fl->csv, "Also write the rows as CSV (rank 0)");
  coll->add_option("--json", fl->json, "Also write the rows as JSON (rank 0)");
  commands.push_back({coll, [fl] { return run_collectives(*fl, describe(*fl)); }});

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
}

}  // namespace
}  // namespace zaya::app

ZAYA_COMMAND(bench, zaya::app::add_bench);
