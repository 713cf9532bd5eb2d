#include "zaya/core/peak_flops.h"

#include <sched.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <utility>

#include "zaya/core/cpu_isa.h"
#include "zaya/core/error.h"

namespace zaya {
namespace {

struct DatasheetEntry {
  const char* name;
  double flops_per_s;
  const char* basis;
};

// Dense bf16 tensor-core rates from the vendors' datasheets (the sparsity figures are twice these).
constexpr DatasheetEntry kDatasheet[] = {
    {"a100", 312e12, "NVIDIA A100 datasheet, dense bf16"},
    {"h100", 989e12, "NVIDIA H100 SXM datasheet, dense bf16"},
    {"h100-pcie", 756e12, "NVIDIA H100 PCIe datasheet, dense bf16"},
    {"h200", 989e12, "NVIDIA H200 datasheet, dense bf16"},
    {"mi300x", 1307e12, "AMD Instinct MI300X datasheet, dense bf16"},
};

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// The value of the first /proc/cpuinfo line that starts with `key` ("" if none).
std::string cpuinfo_field(const std::string& key) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string v = line.substr(colon + 1);
    v.erase(0, v.find_first_not_of(" \t"));
    return v;
  }
  return "";
}

// A number from a one-line sysfs file; 0 when absent or unreadable.
double read_number(const std::string& path) {
  std::ifstream in(path);
  double v = 0;
  if (!(in >> v)) return 0;
  return v;
}

// "Intel(R) Xeon(R) Gold 6230 CPU @ 2.10GHz" -> 2.1; 0 without an "@ X GHz".
double ghz_in_model_name(const std::string& model) {
  const size_t at = model.rfind('@');
  if (at == std::string::npos) return 0;
  double ghz = 0;
  char unit[8] = {};
  if (std::sscanf(model.c_str() + at + 1, " %lf%7s", &ghz, unit) != 2) return 0;
  return std::strcmp(unit, "GHz") == 0 ? ghz : 0;
}

// Distinct (package, core) pairs among the CPUs of this process's affinity mask: SMT siblings share
// one core's FMA units. Without topology files, every allowed CPU counts as a core.
int allowed_physical_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
  std::set<std::pair<long, long>> cores;
  int cpus = 0;
  bool topology = true;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &set)) continue;
    ++cpus;
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
    std::ifstream pkg(dir + "physical_package_id"), core(dir + "core_id");
    long p = 0, k = 0;
    if (!(pkg >> p) || !(core >> k)) topology = false;
    cores.insert({p, k});
  }
  return topology ? static_cast<int>(cores.size()) : cpus;
}

bool has(const IsaList& isa, const char* name) {
  for (int i = 0; i < isa.count; ++i)
    if (std::strcmp(isa.names[i], name) == 0) return true;
  return false;
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

}  // namespace

std::vector<std::string> datasheet_peak_names() {
  std::vector<std::string> names;
  for (const DatasheetEntry& e : kDatasheet) names.emplace_back(e.name);
  return names;
}

std::optional<PeakFlops> datasheet_peak(const std::string& name) {
  for (const DatasheetEntry& e : kDatasheet)
    if (name == e.name) return PeakFlops{e.name, e.flops_per_s, e.basis};
  return std::nullopt;
}

std::optional<PeakFlops> gpu_peak_by_device_name(const std::string& device_name) {
  const std::string n = upper(device_name);
  // The NVL parts (H100 NVL, H200 NVL) have their own clocks and no entry: a stated figure is
  // better than a wrong one.
  if (contains(n, "NVL")) return std::nullopt;
  if (contains(n, "H200")) return datasheet_peak("h200");
  if (contains(n, "H100") && contains(n, "PCIE")) return datasheet_peak("h100-pcie");
  if (contains(n, "H100")) return datasheet_peak("h100");
  if (contains(n, "A100")) return datasheet_peak("a100");
  if (contains(n, "MI300X")) return datasheet_peak("mi300x");
  return std::nullopt;
}

int f32_flops_per_cycle(const CpuFacts& cpu) {
  if (cpu.avx512f) {
    // Zen 4 (family 0x19) splits each 512-bit FMA over its two 256-bit pipes.
    if (cpu.vendor == "AuthenticAMD" && cpu.family == 0x19) return 32;
    return 64;
  }
  if (cpu.avx2 && cpu.fma) return 32;
  if (cpu.avx) return 16;
  return 8;
}

PeakFlops cpu_peak(const CpuFacts& cpu) {
  if (cpu.cores < 1 || !(cpu.ghz > 0))
    throw Error("cannot state this CPU's peak for MFU",
                {.field = "train.mfu_peak",
                 .expected = "known cores and clock, or a stated figure (train.mfu_peak_flops)",
                 .found = "cores " + std::to_string(cpu.cores) + ", clock " + fixed(cpu.ghz, 3) + " GHz"});
  const int per_cycle = f32_flops_per_cycle(cpu);
  const char* isa = cpu.avx512f ? "AVX-512" : cpu.avx2 && cpu.fma ? "AVX2+FMA" : cpu.avx ? "AVX" : "SSE";
  PeakFlops p;
  p.name = "cpu";
  p.flops_per_s = static_cast<double>(cpu.cores) * cpu.ghz * 1e9 * per_cycle;
  p.basis = (cpu.model.empty() ? std::string("CPU") : cpu.model) + ": " + std::to_string(cpu.cores) + " cores x " +
            fixed(cpu.ghz, 3) + " GHz (" + cpu.ghz_source + ") x " + std::to_string(per_cycle) + " f32 FLOP/cycle (" +
            isa + ")";
  return p;
}

CpuFacts detect_cpu(int threads) {
  CpuFacts c;
  c.model = cpuinfo_field("model name");
  c.vendor = cpuinfo_field("vendor_id");
  c.family = std::atoi(cpuinfo_field("cpu family").c_str());
  const IsaList isa = cpu_isa();
  c.avx = has(isa, "avx");
  c.avx2 = has(isa, "avx2");
  c.fma = has(isa, "fma");
  c.avx512f = has(isa, "avx512f");
  c.cores = allowed_physical_cores();
  if (threads > 0 && threads < c.cores) c.cores = threads;
  // The highest clock known: a peak must bound what the cores can do. The nominal clocks (base
  // frequency, the model name's, a VM's "cpu MHz") are exceeded by cores that boost, and say so.
  const std::string freq = "/sys/devices/system/cpu/cpu0/cpufreq/";
  const char* nominal = ", nominal: boosting cores exceed it and MFU reads high";
  if (double max_khz = read_number(freq + "cpuinfo_max_freq"); max_khz > 0) {
    c.ghz = max_khz / 1e6;
    c.ghz_source = "cpufreq cpuinfo_max_freq";
  } else if (double khz = read_number(freq + "base_frequency"); khz > 0) {
    c.ghz = khz / 1e6;
    c.ghz_source = std::string("cpufreq base_frequency") + nominal;
  } else if (double ghz = ghz_in_model_name(c.model); ghz > 0) {
    c.ghz = ghz;
    c.ghz_source = std::string("model name") + nominal;
  } else if (double mhz = std::atof(cpuinfo_field("cpu MHz").c_str()); mhz > 0) {
    c.ghz = mhz / 1e3;
    c.ghz_source = std::string("/proc/cpuinfo cpu MHz") + nominal;
  }
  return c;
}

}  // namespace zaya
