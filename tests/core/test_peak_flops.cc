// The fixed MFU peaks: the datasheet table and its GPU-name lookup, the CPU formula for each ISA
// (cores x clock x f32 FLOPs per cycle), and this machine's detection feeding it.
#include <gtest/gtest.h>

#include "test_util.h"
#include "zaya/core/peak_flops.h"

namespace zaya {
namespace {

TEST(PeakFlops, DatasheetTableAndGpuNames) {
  EXPECT_DOUBLE_EQ(datasheet_peak("h100")->flops_per_s, 989e12);
  EXPECT_DOUBLE_EQ(datasheet_peak("mi300x")->flops_per_s, 1307e12);
  EXPECT_FALSE(datasheet_peak("h800").has_value());
  for (const std::string& n : datasheet_peak_names()) EXPECT_EQ(datasheet_peak(n)->name, n);
  // The names drivers report.
  EXPECT_EQ(gpu_peak_by_device_name("NVIDIA H100 80GB HBM3")->name, "h100");
  EXPECT_EQ(gpu_peak_by_device_name("NVIDIA H100 PCIe")->name, "h100-pcie");
  EXPECT_EQ(gpu_peak_by_device_name("NVIDIA H200")->name, "h200");
  EXPECT_EQ(gpu_peak_by_device_name("NVIDIA A100-SXM4-80GB")->name, "a100");
  EXPECT_EQ(gpu_peak_by_device_name("AMD Instinct MI300X")->name, "mi300x");
  EXPECT_FALSE(gpu_peak_by_device_name("NVIDIA H100 NVL").has_value());
  EXPECT_FALSE(gpu_peak_by_device_name("NVIDIA H200 NVL").has_value());
  EXPECT_FALSE(gpu_peak_by_device_name("NVIDIA GeForce RTX 4090").has_value());
}

TEST(PeakFlops, CpuFormulaPerIsa) {
  CpuFacts zen4{.model = "AMD EPYC", .vendor = "AuthenticAMD", .family = 0x19, .avx = true, .avx2 = true,
                .fma = true, .avx512f = true, .cores = 2, .ghz = 2.596, .ghz_source = "test"};
  EXPECT_EQ(f32_flops_per_cycle(zen4), 32);  // 512-bit FMAs on two 256-bit pipes
  const PeakFlops p = cpu_peak(zen4);
  EXPECT_EQ(p.name, "cpu");
  EXPECT_DOUBLE_EQ(p.flops_per_s, 2 * 2.596e9 * 32);
  EXPECT_NE(p.basis.find("2 cores x 2.596 GHz (test) x 32 f32 FLOP/cycle (AVX-512)"), std::string::npos) << p.basis;

  CpuFacts xeon = zen4;
  xeon.vendor = "GenuineIntel";
  xeon.family = 6;
  EXPECT_EQ(f32_flops_per_cycle(xeon), 64);
  CpuFacts zen5 = zen4;
  zen5.family = 0x1A;
  EXPECT_EQ(f32_flops_per_cycle(zen5), 64);
  CpuFacts avx2 = xeon;
  avx2.avx512f = false;
  EXPECT_EQ(f32_flops_per_cycle(avx2), 32);
  avx2.fma = false;
  EXPECT_EQ(f32_flops_per_cycle(avx2), 16);
  CpuFacts sse{};
  EXPECT_EQ(f32_flops_per_cycle(sse), 8);

  CpuFacts unknown_clock = zen4;
  unknown_clock.ghz = 0;
  EXPECT_NE(test::error_of([&] { cpu_peak(unknown_clock); }).find("train.mfu_peak_flops"), std::string::npos);
}

TEST(PeakFlops, DetectsThisCpu) {
  const CpuFacts c = detect_cpu(/*threads=*/0);
  EXPECT_GE(c.cores, 1);
  EXPECT_GT(c.ghz, 0.1);  // every x86 machine of this century runs above 100 MHz
  EXPECT_LT(c.ghz, 10);
  EXPECT_FALSE(c.ghz_source.empty());
  // The run's thread count caps the cores: idle cores do no work.
  EXPECT_EQ(detect_cpu(1).cores, 1);
  // A fixed figure: detecting twice gives the same peak (the clock is a nominal one, not a reading
  // of the current frequency, except where /proc/cpuinfo is the only source).
  EXPECT_EQ(cpu_peak(detect_cpu(1)).basis, cpu_peak(detect_cpu(1)).basis);
}

}  // namespace
}  // namespace zaya
