#include "zaya/bench/sysinfo.h"

#include <dnnl.h>
#include <mpi.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "zaya/core/cuda_runtime.h"
#include "zaya/core/error.h"
#include "zaya/core/threads.h"

extern "C" char* openblas_get_config(void);

namespace zaya::bench {
namespace {

// The "flags" line of /proc/cpuinfo is the kernel's view of what the CPU offers (and the OS
// enables): exactly what matters for which kernels can run.
std::string cpuinfo_field(const std::string& name) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name, 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "";
}

bool has_flag(const std::string& flags, const std::string& flag) {
  std::istringstream in(flags);
  std::string f;
  while (in >> f)
    if (f == flag) return true;
  return false;
}

}  // namespace

SysInfo query_sysinfo() {
  SysInfo s;
  s.logical_cpus = static_cast<int>(std::thread::hardware_concurrency());
  s.cpu_model = cpuinfo_field("model name");
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  s.memory_gib = static_cast<double>(pages) * static_cast<double>(page) / (1024.0 * 1024.0 * 1024.0);
  std::string flags = cpuinfo_field("flags");
  s.avx2 = has_flag(flags, "avx2");
  s.avx512f = has_flag(flags, "avx512f");
  s.avx512_bf16 = has_flag(flags, "avx512_bf16");
  s.amx_tile = has_flag(flags, "amx_tile");
  s.amx_bf16 = has_flag(flags, "amx_bf16");

  const dnnl_version_t* v = dnnl_version();
  s.onednn_version = str(v->major, ".", v->minor, ".", v->patch, " (cpu runtime ",
                         v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other", ")");
  s.blas_version = openblas_get_config();
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(mpi, &len);  // allowed before MPI_Init
  s.mpi_version = std::string(mpi, static_cast<size_t>(len));
  if (auto nl = s.mpi_version.find_first_of("\n,"); nl != std::string::npos) s.mpi_version.resize(nl);
  s.sentencepiece_version = ZAYA_SENTENCEPIECE_VERSION;

  auto devs = cuda::devices();
  if (devs.empty()) {
    s.cuda = "no CUDA device (" + cuda::no_device_reason() + ")";
  } else {
    std::ostringstream out;
    for (const auto& d : devs)
      out << (d.index ? "\n" : "") << "cuda:" << d.index << " " << d.name << ", sm_" << d.major << d.minor
          << ", " << d.multiprocessors << " SMs, " << d.total_memory / (1024 * 1024) << " MiB";
    s.cuda = out.str();
  }
  return s;
}

std::string format_sysinfo(const SysInfo& s) {
  auto yn = [](bool b) { return b ? "yes" : "no"; };
  std::ostringstream out;
  out << "cpu            " << s.cpu_model << "\n"
      << "cores          " << s.logical_cpus << " logical (zaya threads: " << num_threads() << ")\n"
      << "memory         " << std::fixed;
  out.precision(1);
  out << s.memory_gib << " GiB\n"
      << "isa            avx2 " << yn(s.avx2) << ", avx512f " << yn(s.avx512f) << ", avx512_bf16 "
      << yn(s.avx512_bf16) << ", amx_tile " << yn(s.amx_tile) << ", amx_bf16 " << yn(s.amx_bf16) << "\n"
      << "oneDNN         " << s.onednn_version << "\n"
      << "BLAS           " << s.blas_version << "\n"
      << "MPI            " << s.mpi_version << "\n"
      << "SentencePiece  " << s.sentencepiece_version << "\n"
      << "CUDA build     " << (cuda::built_with_cuda() ? "yes" : "no") << "\n"
      << "CUDA devices   " << s.cuda << "\n";
  return out.str();
}

}  // namespace zaya::bench
