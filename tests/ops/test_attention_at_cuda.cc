// One test, two devices: the positioned attention of context parallelism (attention_at_forward /
// attention_at_backward: a chunk of queries at global positions q_pos.. against the gathered keys
// 0..Tk−1) on CUDA against the CPU op (itself tested against the full causal attention in
// test_attention_at.cc), from the same random inputs. The CUDA side is the fp32 reference kernels
// with a key offset (cuda/attention.cu); the CPU side its tiled kernel for offsets on its 64-row
// tiles and its row-by-row kernel otherwise, so both CPU paths are compared. Skipped with a message
// where no GPU is present; scripts/gpu_check.sh runs them on one.
//
// Tolerances, norm-wise relative, those of test_attention_cuda.cc's fp32 comparison and for the
// same reasons: forward (out, lse) kFwd = 2e-5: each output is a softmax-weighted sum over up to
// Tk = 192 keys whose scores are dots of hd terms, summed one key at a time with a running max on
// the GPU and in tiles or rows on the CPU, with exps differing by an ulp or two: a few ulp per
// term over ~200 terms of random sign. Gradients kBwd = 1e-4: dS = P·(dP − D) subtracts nearly
// equal sums, and dk, dv add G·Tq such terms of random sign. dk and dv start from the same random
// values on both devices (the op accumulates), so the comparison covers the addition too.
#include <gtest/gtest.h>

#include <string>

#include "ops/cuda_compare.h"
#include "zaya/ops/attention.h"

namespace zaya::ops {
namespace {

using test::bitwise_equal;
using test::on_gpu;
using test::random_tensor;
using test::rel_diff;

constexpr double kFwd = 2e-5, kBwd = 1e-4;

struct Chunk {
  int64_t B, Tq, Tk, q_pos, nq, nkv, hd;
  std::string name() const {
    return str("B ", B, " Tq ", Tq, " Tk ", Tk, " q_pos ", q_pos, " nq ", nq, " nkv ", nkv, " hd ", hd);
  }
};

struct Results {
  Tensor out, lse, dq, dk, dv;
};

// Forward and backward on `device` from seeds; the inputs are made on the host. dk, dv start from
// random values (seeds 5, 6), which the backward adds to.
Results run(const Chunk& c, Device device) {
  auto in = [&](const Shape& shape, uint64_t seed) {
    Tensor t = random_tensor(shape, seed);
    return device == Device::cuda ? on_gpu(t) : t;
  };
  auto empty = [&](const Shape& shape) { return Tensor::empty(shape, DType::f32, device); };
  const Tensor q = in({c.B, c.Tq, c.nq, c.hd}, 1), k = in({c.B, c.Tk, c.nkv, c.hd}, 2),
               v = in({c.B, c.Tk, c.nkv, c.hd}, 3), dout = in({c.B, c.Tq, c.nq, c.hd}, 4);
  Results r{empty({c.B, c.Tq, c.nq, c.hd}), empty({c.B, c.nq, c.Tq}), empty({c.B, c.Tq, c.nq, c.hd}),
            in({c.B, c.Tk, c.nkv, c.hd}, 5), in({c.B, c.Tk, c.nkv, c.hd}, 6)};
  attention_at_forward(r.out, r.lse, q, k, v, c.B, c.Tq, c.Tk, c.q_pos, c.nq, c.nkv, c.hd);
  attention_at_backward(r.dq, r.dk, r.dv, dout, q, k, v, r.out, r.lse, c.B, c.Tq, c.Tk, c.q_pos, c.nq, c.nkv,
                        c.hd);
  return r;
}

// GQA with 2 and 4 q heads per kv head; an offset off the CPU's 64-row tiles with keys past the
// chunk's last query (the CPU's row kernel), offsets on the tiles (its tiled kernel) with head dims
// 128 (ZAYA1's) and 40 (lanes partly idle), a one-token chunk (what cp = K gives a sequence of 2K
// tokens), and q_pos 0 with Tk = Tq (the plain causal attention).
const Chunk kChunks[] = {{2, 37, 100, 50, 4, 2, 40},  {1, 64, 192, 128, 8, 2, 128}, {2, 64, 128, 64, 4, 1, 40},
                         {3, 1, 6, 5, 2, 1, 32},      {2, 24, 24, 0, 4, 2, 64}};

TEST(AttentionAtCuda, ReferenceKernelsMatchTheCpuAtEveryOffset) {
  ZAYA_SKIP_WITHOUT_GPU();
  for (const Chunk& c : kChunks) {
    SCOPED_TRACE(c.name());
    const Results gpu = run(c, Device::cuda), cpu = run(c, Device::cpu);
    EXPECT_LT(rel_diff(gpu.out, cpu.out), kFwd) << "out";
    EXPECT_LT(rel_diff(gpu.lse, cpu.lse), kFwd) << "lse";
    EXPECT_LT(rel_diff(gpu.dq, cpu.dq), kBwd) << "dq";
    EXPECT_LT(rel_diff(gpu.dk, cpu.dk), kBwd) << "dk";
    EXPECT_LT(rel_diff(gpu.dv, cpu.dv), kBwd) << "dv";
    // Keys no query sees (positions q_pos + Tq ..) keep their gradients' start values bit for bit.
    const int64_t seen = c.q_pos + c.Tq;
    if (seen < c.Tk) {
      const Tensor start_dk = random_tensor({c.B, c.Tk, c.nkv, c.hd}, 5);
      for (int64_t b = 0; b < c.B; ++b)
        EXPECT_TRUE(bitwise_equal(gpu.dk.select(b).slice(seen, c.Tk), start_dk.select(b).slice(seen, c.Tk)))
            << "batch row " << b;
    }
    // One writer per output, sums in a fixed order: the same bits again.
    const Results again = run(c, Device::cuda);
    EXPECT_TRUE(bitwise_equal(again.out, gpu.out));
    EXPECT_TRUE(bitwise_equal(again.dq, gpu.dq));
    EXPECT_TRUE(bitwise_equal(again.dk, gpu.dk));
    EXPECT_TRUE(bitwise_equal(again.dv, gpu.dv));
  }
}

}  // namespace
}  // namespace zaya::ops
