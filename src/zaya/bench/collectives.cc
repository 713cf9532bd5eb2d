#include "zaya/bench/collectives.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <ostream>
#include <thread>

#include "zaya/core/cuda_runtime.h"
#include "zaya/core/tensor.h"

namespace zaya::bench {

using namespace zaya::dist;

void CollectivesOptions::validate() const {
  ZAYA_CHECK(min_bytes <= max_bytes, "-b (minimum size) ", min_bytes, " is larger than -e (maximum size) ", max_bytes);
  ZAYA_CHECK(step_factor >= 1, "-f (step factor) must be at least 1, found ", step_factor);
  ZAYA_CHECK(!(step_factor > 1 && min_bytes == 0), "-b 0 with -f ", step_factor, " would never grow: start at -b 1 or more");
  ZAYA_CHECK(step_factor > 1 || step_bytes > 0, "-i (step bytes) must be positive when -f is 1");
  ZAYA_CHECK(iters >= 1, "-n (iterations) must be at least 1, found ", iters);
  ZAYA_CHECK(warmup >= 0, "-w (warmup iterations) must not be negative, found ", warmup);
  ZAYA_CHECK(check >= 0, "-c (check) must be 0 or more, found ", check);
  ZAYA_CHECK(dtype == DType::f32 || dtype == DType::bf16, "--dtype must be float or bfloat16");
  ZAYA_CHECK(!ops.empty(), "--op selected no collective");
}

namespace {

const char* type_name(DType t) { return t == DType::bf16 ? "bfloat16" : "float"; }
const char* redop_name(Coll c) {
  c = fixed_count_form(c);
  return c == Coll::all_reduce || c == Coll::reduce_scatter ? "sum" : "none";
}

// Input element i of rank r: a small integer, so every sum over ranks is exact in fp32 and in
// bf16 (at most 256, and bf16 holds every integer up to 256). `rep` varies the data per test so a
// stale buffer from the previous size cannot pass the check.
float pattern(int rank, size_t i, int rep, int nranks) {
  const uint64_t m = std::clamp<uint64_t>(256 / static_cast<uint64_t>(nranks), 1, 16);
  return static_cast<float>((static_cast<uint64_t>(rank + 1) * 131 + i * 7 + static_cast<uint64_t>(rep) * 13) % m);
}

// Test hook (not a user feature): ZAYA_TEST_DIE_RANK=r ZAYA_TEST_DIE_AT=k makes rank r stop at
// its k-th collective call of the sweep, by exiting (ZAYA_TEST_DIE_MODE=exit, default) or by
// hanging (=hang), so the tests can check that the other ranks name it.
struct DieHook {
  int rank = -1;
  long at = -1;
  bool hang = false;
  long calls = 0;
  DieHook() {
    if (const char* r = std::getenv("ZAYA_TEST_DIE_RANK")) rank = std::atoi(r);
    if (const char* a = std::getenv("ZAYA_TEST_DIE_AT")) at = std::atol(a);
    if (const char* m = std::getenv("ZAYA_TEST_DIE_MODE")) hang = std::strcmp(m, "hang") == 0;
  }
  void tick(int my_rank) {
    ++calls;
    if (my_rank != rank || calls != at) return;
    std::fprintf(stderr, "zaya: test hook: rank %d %s at collective call %ld\n", my_rank, hang ? "hangs" : "exits",
                 calls);
    std::fflush(stderr);
    if (hang)
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    std::_Exit(17);
  }
};

// Host staging + buffers on the communicator's device.
class Buffers {
 public:
  Buffers(Device device, size_t send_bytes, size_t recv_bytes)
      : device_(device),
        send_(Tensor::empty(Shape{static_cast<int64_t>(std::max<size_t>(send_bytes, 1))}, DType::u8, device)),
        recv_(Tensor::empty(Shape{static_cast<int64_t>(std::max<size_t>(recv_bytes, 1))}, DType::u8, device)),
        host_(std::max(send_bytes, recv_bytes)) {}
  char* send() const { return static_cast<char*>(send_.raw()); }
  char* recv() const { return static_cast<char*>(recv_.raw()); }
  std::vector<char>& host() { return host_; }
  void upload(char* dst, size_t bytes) {
    if (!bytes) return;
    if (device_ == Device::cpu) std::memcpy(dst, host_.data(), bytes);
    else cuda::copy(dst, device_, host_.data(), Device::cpu, bytes);
  }
  void download(const char* src, size_t bytes) {
    if (!bytes) return;
    if (device_ == Device::cpu) std::memcpy(host_.data(), src, bytes);
    else cuda::copy(host_.data(), Device::cpu, src, device_, bytes);
  }
  void clear_recv(size_t bytes) {
    if (!bytes) return;
    if (device_ == Device::cpu) std::memset(recv(), 0, bytes);
    else cuda::memset_device(recv(), 0, bytes);
  }

 private:
  Device device_;
  Tensor send_, recv_;
  std::vector<char> host_;
};

void store(std::vector<char>& host, size_t index, float v, DType t) {
  if (t == DType::bf16) {
    bf16 h = to_bf16(v);
    std::memcpy(host.data() + index * 2, &h, 2);
  } else {
    std::memcpy(host.data() + index * 4, &v, 4);
  }
}
float load(const std::vector<char>& host, size_t index, DType t) {
  if (t == DType::bf16) {
    bf16 h;
    std::memcpy(&h, host.data() + index * 2, 2);
    return to_float(h);
  }
  float v;
  std::memcpy(&v, host.data() + index * 4, 4);
  return v;
}

struct Test {
  dist::Communicator& comm;
  Coll op;
  CollSizes sz;
  DType t;
  Buffers& buf;
  DieHook& hook;
  int root = 0;
  std::vector<size_t> counts = std::vector<size_t>(comm.size(), sz.count);  // the _v forms' counts

  size_t ts() const { return dtype_size(t); }
  // A _v form shares its fixed-count form's layout and results (every rank's count is sz.count).
  Coll base() const { return fixed_count_form(op); }
  // Where the input and output live for this placement (the nccl-tests layout).
  char* send_ptr(bool in_place) const {
    if (!in_place) return buf.send();
    if (base() == Coll::all_gather) return buf.recv() + comm.rank() * sz.count * ts();
    return buf.recv();
  }
  char* recv_ptr(bool in_place) const {
    if (in_place && base() == Coll::reduce_scatter) return buf.recv() + comm.rank() * sz.count * ts();
    return buf.recv();
  }

  void run(bool in_place) {
    hook.tick(comm.rank());
    char* s = send_ptr(in_place);
    char* r = recv_ptr(in_place);
    switch (op) {
      case Coll::all_reduce: comm.all_reduce(s, r, sz.count, t); break;
      case Coll::reduce_scatter: comm.reduce_scatter(s, r, sz.count, t); break;
      case Coll::all_gather: comm.all_gather(s, r, sz.count, t); break;
      case Coll::broadcast: comm.broadcast(s, r, sz.count, t, root); break;
      case Coll::all_to_all: comm.all_to_all(s, r, sz.count, t); break;
      case Coll::reduce_scatter_v: comm.reduce_scatter_v(s, r, counts, t); break;
      case Coll::all_gather_v: comm.all_gather_v(s, r, counts, t); break;
    }
  }

  void fill(bool in_place, int rep) {
    const int me = comm.rank(), n = comm.size();
    buf.clear_recv(std::max(sz.send_count, sz.recv_count) * ts());
    for (size_t i = 0; i < sz.send_count; ++i) store(buf.host(), i, pattern(me, i, rep, n), t);
    buf.upload(send_ptr(in_place), sz.send_count * ts());
  }

  // Counts the received elements that differ from the exactly known result.
  int64_t wrong(bool in_place, int rep) {
    const int me = comm.rank(), n = comm.size();
    buf.download(recv_ptr(in_place), sz.recv_count * ts());
    const size_t c = sz.count;
    // Test hook: ZAYA_TEST_CORRUPT_RANK=r flips the first received element on rank r, so the
    // tests can see a wrong result counted and reported.
    if (const char* cr = std::getenv("ZAYA_TEST_CORRUPT_RANK"); cr && std::atoi(cr) == me && sz.recv_count)
      store(buf.host(), 0, load(buf.host(), 0, t) + 1.0f, t);
    int64_t bad = 0;
    for (size_t i = 0; i < sz.recv_count; ++i) {
      float want = 0;
      switch (base()) {
        case Coll::all_reduce:
          for (int q = 0; q < n; ++q) want += pattern(q, i, rep, n);
          break;
        case Coll::reduce_scatter:
          for (int q = 0; q < n; ++q) want += pattern(q, me * c + i, rep, n);
          break;
        case Coll::all_gather: want = pattern(static_cast<int>(i / c), i % c, rep, n); break;
        case Coll::broadcast: want = pattern(root, i, rep, n); break;
        case Coll::all_to_all: want = pattern(static_cast<int>(i / c), me * c + i % c, rep, n); break;
        default: break;  // base() is never a _v form
      }
      bad += load(buf.host(), i, t) != want;
    }
    return bad;
  }
};

void print_preamble(dist::Communicator& comm, const CollectivesOptions& o, std::ostream& out) {
  // One line per rank, gathered to rank 0 in rank order, as nccl-tests' "Using devices".
  char line[256];
  char host[64] = {0};
  gethostname(host, sizeof host - 1);
  const bool gpu = comm.device() == Device::cuda;
  std::snprintf(line, sizeof line, "#  Rank %2d Group %2d Pid %6d on %10s device %2d [0x%02x] %s\n", comm.rank(), 0,
                static_cast<int>(getpid()), host, gpu ? 0 : -1, 0,
                gpu ? "CUDA device (nccl, device buffers)" : "CPU (mpi, host buffers)");
  std::vector<char> all(sizeof line * comm.size());
  comm.host_all_gather(line, all.data(), sizeof line);
  if (comm.rank() != 0) return;
  char head[512];
  std::snprintf(head, sizeof head,
                "# nThread %d nGpus %d minBytes %llu maxBytes %llu step: %llu(%s) warmup iters: %d iters: %d agg "
                "iters: %d validation: %d graph: %d\n",
                1, 1, static_cast<unsigned long long>(o.min_bytes), static_cast<unsigned long long>(o.max_bytes),
                static_cast<unsigned long long>(o.step_factor > 1 ? o.step_factor : o.step_bytes),
                o.step_factor > 1 ? "factor" : "bytes", o.warmup, o.iters, 1, o.check, 0);
  out << "# zaya bench collectives: backend " << dist::backend_name(comm.backend()) << ", " << comm.size()
      << " ranks\n"
      << head << "#\n# Using devices\n";
  for (int r = 0; r < comm.size(); ++r) out << (all.data() + r * sizeof line);
  out.flush();
}

void print_table_header(Coll op, std::ostream& out) {
  char b[1024];
  std::snprintf(b, sizeof b, "#\n# Collective test starting: %s\n#\n", std::string(coll_name(op)).c_str());
  out << b;
  std::snprintf(b, sizeof b, "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n",
                "", "", "", "", "");
  out << b;
  std::snprintf(b, sizeof b, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "size", "count",
                "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
  out << b;
  std::snprintf(b, sizeof b, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n", "(B)",
                "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  out << b;
}

void print_row(const CollResult& r, DType t, bool checked, std::ostream& out) {
  char b[512];
  char root[16];
  std::snprintf(root, sizeof root, "%6i", r.root);
  std::snprintf(b, sizeof b, "%12zu  %12zu  %8s  %6s  %6s", r.sizes.bytes, r.sizes.count, type_name(t),
                redop_name(r.op), root);
  out << b;
  for (int p = 0; p < 2; ++p) {
    if (checked)
      std::snprintf(b, sizeof b, "  %7s  %6.2f  %6.2f  %5g", format_time_us(r.time_us[p]).c_str(), r.algbw[p],
                    r.busbw[p], static_cast<double>(r.wrong[p]));
    else
      std::snprintf(b, sizeof b, "  %7s  %6.2f  %6.2f  %5s", format_time_us(r.time_us[p]).c_str(), r.algbw[p],
                    r.busbw[p], "N/A");
    out << b;
  }
  out << "\n";
  out.flush();
}

void print_footer(Coll op, int failed_tests, double avg_busbw, const std::vector<CollResult>& op_rows,
                  std::ostream& out) {
  char b[512];
  if (const uint64_t sat = saturation_bytes(op_rows); sat > 0) {
    std::snprintf(b, sizeof b, "# Saturation (90%% of the best out-of-place busbw) from : %llu B\n",
                  static_cast<unsigned long long>(sat));
    out << b;
  }
  std::snprintf(b, sizeof b, "# Out of bounds values : %d %s\n", failed_tests, failed_tests ? "FAILED" : "OK");
  out << b;
  std::snprintf(b, sizeof b, "# Avg bus bandwidth    : %g %s\n", avg_busbw, "");
  out << b << "#\n# Collective test concluded: " << coll_name(op) << "\n";
  out.flush();
}

}  // namespace

uint64_t saturation_bytes(const std::vector<CollResult>& rows, double fraction) {
  double best = 0;
  for (const CollResult& r : rows) best = std::max(best, r.busbw[0]);
  if (best <= 0) return 0;
  uint64_t at = 0;
  for (const CollResult& r : rows)
    if (r.busbw[0] >= fraction * best && (at == 0 || r.sizes.bytes < at)) at = r.sizes.bytes;
  return at;
}

namespace {

void write_csv(const std::string& path, const std::vector<CollResult>& rows, int nranks, DType t) {
  std::ofstream f(path);
  ZAYA_CHECK(f.good(), "cannot write the CSV file ", path);
  f << "op,ranks,size_bytes,count,type,redop,root,oop_time_us,oop_algbw_gbs,oop_busbw_gbs,oop_wrong,"
       "ip_time_us,ip_algbw_gbs,ip_busbw_gbs,ip_wrong\n";
  for (const auto& r : rows) {
    f << coll_name(r.op) << ',' << nranks << ',' << r.sizes.bytes << ',' << r.sizes.count << ',' << type_name(t)
      << ',' << redop_name(r.op) << ',' << r.root;
    for (int p = 0; p < 2; ++p) f << ',' << r.time_us[p] << ',' << r.algbw[p] << ',' << r.busbw[p] << ',' << r.wrong[p];
    f << '\n';
  }
  ZAYA_CHECK(f.good(), "error while writing the CSV file ", path);
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += c;
    else if (static_cast<unsigned char>(c) < 0x20) o += ' ';
    else o += c;
  }
  return o;
}

void write_json(const std::string& path, const std::vector<CollResult>& rows, const dist::Communicator& comm,
                const CollectivesOptions& o) {
  std::ofstream f(path);
  ZAYA_CHECK(f.good(), "cannot write the JSON file ", path);
  f << "{\n  \"command\": \"" << json_escape(o.command_line) << "\",\n  \"backend\": \""
    << dist::backend_name(comm.backend()) << "\",\n  \"ranks\": " << comm.size() << ",\n  \"type\": \""
    << type_name(o.dtype) << "\",\n  \"config\": {\"minimum_bytes\": " << o.min_bytes
    << ", \"maximum_bytes\": " << o.max_bytes << ", \"step_factor\": " << o.step_factor
    << ", \"step_bytes\": " << o.step_bytes << ", \"iterations\": " << o.iters << ", \"warmup_iters\": " << o.warmup
    << ", \"validation\": " << o.check << "},\n  \"results\": [";
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    f << (i ? ",\n" : "\n") << "    {\"op\": \"" << coll_name(r.op) << "\", \"size\": " << r.sizes.bytes
      << ", \"count\": " << r.sizes.count << ", \"type\": \"" << type_name(o.dtype) << "\", \"redop\": \""
      << redop_name(r.op) << "\", \"root\": " << r.root;
    const char* key[2] = {"out_of_place", "in_place"};
    for (int p = 0; p < 2; ++p)
      f << ", \"" << key[p] << "\": {\"time\": " << r.time_us[p] << ", \"alg_bw\": " << r.algbw[p]
        << ", \"bus_bw\": " << r.busbw[p] << ", \"nwrong\": " << r.wrong[p] << "}";
    f << "}";
  }
  f << "\n  ]\n}\n";
  ZAYA_CHECK(f.good(), "error while writing the JSON file ", path);
}

}  // namespace

std::vector<CollResult> run_collectives(dist::Communicator& comm, const CollectivesOptions& o, std::ostream& out) {
  o.validate();
  const int n = comm.size(), me = comm.rank();
  const size_t ts = dtype_size(o.dtype);
  const auto sizes = sweep_sizes(o.min_bytes, o.max_bytes, o.step_factor, o.step_bytes);

  // One pair of buffers for the whole sweep, sized for its largest test (in-place tests use recv
  // for input too, so it must hold the larger of the two).
  size_t max_send = 0, max_recv = 0;
  for (Coll op : o.ops)
    for (uint64_t s : sizes) {
      CollSizes z = coll_sizes(op, s, ts, n);
      max_send = std::max(max_send, z.send_count * ts);
      max_recv = std::max({max_recv, z.recv_count * ts, z.send_count * ts});
    }
  Buffers buf(comm.device(), max_send, max_recv);
  DieHook hook;

  print_preamble(comm, o, out);
  std::vector<CollResult> rows;
  int rep = 0;
  for (Coll op : o.ops) {
    if (me == 0) print_table_header(op, out);
    int failed = 0;
    double bw_sum = 0;
    int bw_count = 0;
    for (uint64_t s : sizes) {
      Test test{comm, op, coll_sizes(op, s, ts, n), o.dtype, buf, hook};
      CollResult r{.op = op, .sizes = test.sz, .root = op == Coll::broadcast ? test.root : -1};
      for (int p = 0; p < 2; ++p) {
        const bool in_place = p == 1;
        test.fill(in_place, rep);
        for (int w = 0; w < o.warmup; ++w) test.run(in_place);
        comm.barrier();
        auto t0 = std::chrono::steady_clock::now();
        for (int it = 0; it < o.iters; ++it) test.run(in_place);
        double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / o.iters;
        // The slowest rank sets the pace of a collective: report the max over ranks.
        sec = comm.host_max(sec);
        r.time_us[p] = sec * 1e6;
        r.algbw[p] = sec > 0 ? static_cast<double>(test.sz.bytes) / 1e9 / sec : 0;
        r.busbw[p] = r.algbw[p] * bus_factor(op, n);
        bw_sum += r.busbw[p];
        ++bw_count;
        // Validation: fresh data, one more call, every element against its exact value.
        for (int c = 0; c < o.check; ++c) {
          ++rep;
          test.fill(in_place, rep);
          test.run(in_place);
          r.wrong[p] = comm.host_sum(test.wrong(in_place, rep));
          if (r.wrong[p]) break;
        }
        if (r.wrong[p]) ++failed;
      }
      if (me == 0) print_row(r, o.dtype, o.check > 0, out);
      rows.push_back(r);
    }
    if (me == 0)
      print_footer(op, failed, bw_count ? bw_sum / bw_count : 0,
                   std::vector<CollResult>(rows.end() - static_cast<std::ptrdiff_t>(sizes.size()), rows.end()), out);
  }
  if (me == 0 && !o.csv_path.empty()) write_csv(o.csv_path, rows, n, o.dtype);
  if (me == 0 && !o.json_path.empty()) write_json(o.json_path, rows, comm, o);
  return rows;
}

}  // namespace zaya::bench
