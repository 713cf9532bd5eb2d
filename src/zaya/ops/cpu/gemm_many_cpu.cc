// Independent GEMMs on the CPU: side by side, one per thread as the threads free up, where there
// are several problems and threads. A GEMM's bits do not depend on the thread that runs it or on
// how many run it (ops/gemm.cc: an uncut weight gradient runs on one thread everywhere), so this is
// bitwise the problems one after another.
#include "zaya/ops/cpu/gemm_many_cpu.h"

#include <omp.h>

#include "zaya/core/parallel.h"
#include "zaya/core/threads.h"

namespace zaya::ops::cpu {

void gemm_many(std::span<const GemmProblem> problems, Trans ta, Trans tb, float alpha, float beta) {
  auto run = [&](size_t j) { gemm(problems[j].C, problems[j].A, ta, problems[j].B, tb, alpha, beta); };
  const int threads = num_threads();
  if (threads > 1 && problems.size() > 1 && !omp_in_parallel())
    take_in_turn(problems.size(), threads, run);
  else
    for (size_t j = 0; j < problems.size(); ++j) run(j);
}

}  // namespace zaya::ops::cpu
