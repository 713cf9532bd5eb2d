// Shared by the GEMM tests (test_gemm.cc: plain and batched products; test_gemm_grouped.cc: the
// grouped expert products): the float64 reference product and the grouped cases built on it.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "ops/gradcheck.h"
#include "zaya/ops/gemm.h"

namespace zaya::ops::gemm_test {

using test::random_tensor;
using test::to_f64;

// C = alpha·op(A)·op(B) + beta·C in double, row-major, batch-major; B may be shared over the batch.
inline std::vector<double> gemm_reference(const std::vector<double>& a, Trans ta,
                                          const std::vector<double>& b, Trans tb, std::vector<double> c,
                                          int64_t batch, int64_t m, int64_t n, int64_t k, double alpha,
                                          double beta, bool shared_b = false) {
  for (int64_t z = 0; z < batch; ++z) {
    const double* A = a.data() + z * m * k;
    const double* B = b.data() + (shared_b ? 0 : z * k * n);
    double* C = c.data() + z * m * n;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p) {
          double av = ta == Trans::N ? A[i * k + p] : A[p * m + i];
          double bv = tb == Trans::N ? B[p * n + j] : B[j * k + p];
          s += av * bv;
        }
        C[i * n + j] = alpha * s + beta * C[i * n + j];
      }
  }
  return c;
}

inline Shape operand_shape(int64_t rows, int64_t cols, Trans t) {
  return t == Trans::N ? Shape{rows, cols} : Shape{cols, rows};
}

struct Dims {
  int64_t m, n, k;
};

// Bitwise equality of two f32 tensors.
inline bool same_bits(const Tensor& a, const Tensor& b) {
  // (memcmp may not be given the null data pointer of an empty tensor, even for 0 bytes)
  return a.nbytes() == b.nbytes() && (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

// The grouped expert GEMMs with token counts that change from group to group and call to call, in
// the three forms the MoE layer uses (x·Wᵀ, dy·W, and dW += dyᵀ·x with the tokens as the
// reduction dim), f32 and bf16. The counts cover the bf16 path's row blocks (kRowBlock = 32 in
// ops/cpu/gemm_grouped_cpu.cc): below one block, exact blocks, a block plus a tail, several blocks plus a tail.
struct GroupedForm {
  Trans ta, tb;
  float beta;
};

// One grouped call's problems in form f with token counts ms (expert weight [n, k]) and their
// float64 references: x·Wᵀ: A [m, k], B [n, k];  dy·W: A [m, n], B [n, k];  dyᵀ·x: A [m, n],
// B [m, k], C [n, k]. Seeds run from seed + 1 up.
struct GroupedCase {
  std::vector<GemmProblem> problems;
  std::vector<std::vector<double>> refs;
};
inline GroupedCase make_grouped_case(GroupedForm f, const std::vector<int64_t>& ms, int64_t n, int64_t k,
                                     DType dt, uint64_t seed) {
  GroupedCase g;
  for (int64_t m : ms) {
    Shape a_shape = f.ta == Trans::T || f.tb == Trans::N ? Shape{m, n} : Shape{m, k};
    Shape b_shape = f.ta == Trans::T ? Shape{m, k} : Shape{n, k};
    Shape c_shape = f.ta == Trans::T ? Shape{n, k} : (f.tb == Trans::N ? Shape{m, k} : Shape{m, n});
    Tensor A = random_tensor(a_shape, ++seed, 1.0f, dt), B = random_tensor(b_shape, ++seed, 1.0f, dt);
    Tensor C = random_tensor(c_shape, ++seed);
    int64_t rm = c_shape[0], rn = c_shape[1], rk = f.ta == Trans::T ? m : a_shape[1];
    g.refs.push_back(gemm_reference(to_f64(A), f.ta, to_f64(B), f.tb, to_f64(C), 1, rm, rn, rk, 1, f.beta));
    g.problems.push_back({A, B, C});
  }
  return g;
}

}  // namespace zaya::ops::gemm_test
