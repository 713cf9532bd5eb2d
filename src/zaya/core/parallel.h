// Dynamic task loops on OpenMP threads, for work whose pieces take unequal times (the shared VM's
// vCPUs often run at different speeds, so pieces dealt out in advance leave one thread idle).
#pragma once

#include <omp.h>

#include <atomic>
#include <cstddef>
#include <exception>

namespace zaya {

// Runs run_one(j) for j = 0..count−1 on `threads` threads, each taking the next j as it frees up;
// begin() and end() run once per thread around its share. An exception must not leave the parallel
// region: the first one is rethrown after it (the thread that threw takes no more tasks).
template <class Begin, class RunOne, class End>
void take_in_turn(size_t count, int threads, Begin&& begin, RunOne&& run_one, End&& end) {
  std::exception_ptr error;
  std::atomic<size_t> next{0};
#pragma omp parallel num_threads(threads)
  {
    try {
      begin();
      for (size_t j = next.fetch_add(1); j < count; j = next.fetch_add(1)) run_one(j);
      end();
    } catch (...) {
#pragma omp critical(zaya_take_in_turn_error)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

template <class RunOne>
void take_in_turn(size_t count, int threads, RunOne&& run_one) {
  take_in_turn(count, threads, [] {}, run_one, [] {});
}

}  // namespace zaya
