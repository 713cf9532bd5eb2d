// One test, two devices: causal GQA attention on CUDA against the CPU kernels (the reference, tested
// against float64 and finite differences in test_attention.cc), from the same random inputs; both
// CUDA implementations (docs/cuda.md, "Attention"): the fp32 reference kernels and cuDNN's bf16
// fused SDPA. Skipped with a message where no GPU (or, for cuDNN, no loadable cuDNN) is present;
// scripts/gpu_check.sh runs them on one.
//
// Tolerances, norm-wise relative:
// - fp32 reference kernels against the CPU. Forward kFwd = 2e-5: every output is a softmax-weighted
//   sum over up to T = 150 keys, its scores dots of hd terms; the GPU sums keys one at a time with a
//   running max, the CPU in 64-key tiles, and their exps differ (CUDA's expf ≤ 2 ulp, the CPU's
//   expf_fast ~1 ulp); a few ulp per term over ~150 terms of random sign: ~1e-6 to 1e-5, above the
//   1e-5 of a short sum. Gradients kBwd = 1e-4: dS = P·(dP − D) subtracts two nearly equal sums,
//   and dk, dv add G·T such terms of random sign, which amplifies the relative error.
// - cuDNN (bf16 inputs, fp32 accumulation) against the CPU in fp32. Its error is not a reduction
//   depth times 2⁻⁸: cuDNN accumulates in fp32, so what it adds is a few bf16 roundings per element,
//   each ≤ 2⁻⁹ relative (q, k and v on the way in, the probabilities before P·V, the output).
//   Forward kBf16Fwd = 4·2⁻⁸ (four roundings at 2⁻⁸ each, a factor 2 of margin over their unit
//   roundoff), lse kBf16Lse = 2⁻⁸ (a log of sums of exps of bf16 scores: the score's rounding,
//   divided by lse ≈ log T); gradients kBf16Bwd = 8·2⁻⁸: the backward chains twice as many roundings
//   (dO and O in bf16, dP − D with cancellation, dS in bf16 before dS·K and dSᵀ·Q).
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "ops/cuda_compare.h"
#include "ops/device_dispatch.h"
#include "zaya/ops/attention.h"
#if defined(ZAYA_HAVE_CUDA)  // the implementation switch; a CPU-only build has no CUDA kernels to test
#include "zaya/ops/cuda/attention_cudnn.h"
#include "zaya/ops/cuda/sequence_cuda.h"

namespace zaya::ops {
namespace {

using test::bitwise_equal;
using test::gpu_empty;
using test::on_gpu;
using test::random_tensor;
using test::rel_diff;

constexpr double kFwd = 2e-5, kBwd = 1e-4;
constexpr double kBf16Fwd = 4.0 / 256, kBf16Lse = 1.0 / 256, kBf16Bwd = 8.0 / 256;

struct Shape5 {
  int64_t B, T, nq, nkv, hd;
};

struct Results {
  Tensor out, lse, dq, dk, dv;
};

// Forward and backward on the inputs' device, from seeds; the inputs are made on the host.
Results run(const Shape5& s, Device device) {
  const auto [B, T, nq, nkv, hd] = s;
  auto in = [&](const Shape& shape, uint64_t seed) {
    Tensor t = random_tensor(shape, seed);
    return device == Device::cuda ? on_gpu(t) : t;
  };
  auto empty = [&](const Shape& shape) { return Tensor::empty(shape, DType::f32, device); };
  Tensor q = in({B, T, nq, hd}, 1), k = in({B, T, nkv, hd}, 2), v = in({B, T, nkv, hd}, 3);
  Tensor dout = in({B, T, nq, hd}, 4);
  Results r{empty({B, T, nq, hd}), empty({B, nq, T}), empty({B, T, nq, hd}), empty({B, T, nkv, hd}),
            empty({B, T, nkv, hd})};
  attention_forward(r.out, r.lse, q, k, v, B, T, nq, nkv, hd);
  attention_backward(r.dq, r.dk, r.dv, dout, q, k, v, r.out, r.lse, B, T, nq, nkv, hd);
  return r;
}

void expect_close(const Results& gpu, const Results& cpu, double fwd, double lse, double bwd, const char* what) {
  EXPECT_LT(rel_diff(gpu.out, cpu.out), fwd) << what << ": out";
  EXPECT_LT(rel_diff(gpu.lse, cpu.lse), lse) << what << ": lse";
  EXPECT_LT(rel_diff(gpu.dq, cpu.dq), bwd) << what << ": dq";
  EXPECT_LT(rel_diff(gpu.dk, cpu.dk), bwd) << what << ": dk";
  EXPECT_LT(rel_diff(gpu.dv, cpu.dv), bwd) << what << ": dv";
}

// Selects an implementation for the test's thread and restores the previous one after.
class UseImpl {
 public:
  explicit UseImpl(cuda::AttentionImpl impl) : saved_(cuda::attention_impl()) { cuda::set_attention_impl(impl); }
  ~UseImpl() { cuda::set_attention_impl(saved_); }

 private:
  cuda::AttentionImpl saved_;
};

// GQA with 2 q heads per kv head; T not a multiple of the CPU's 64-key tiles; head dims 40 (lanes
// partly idle) and ZAYA1's 128.
const Shape5 kShapes[] = {{2, 77, 4, 2, 40}, {1, 150, 8, 2, 128}};

TEST(AttentionCuda, ReferenceKernelsMatchTheCpu) {
  ZAYA_SKIP_WITHOUT_GPU();
  const UseImpl use(cuda::AttentionImpl::reference);
  for (const Shape5& s : kShapes) {
    const Results gpu = run(s, Device::cuda), cpu = run(s, Device::cpu);
    expect_close(gpu, cpu, kFwd, kFwd, kBwd, s.hd == 40 ? "hd 40" : "hd 128");
    // One writer per output, sums in a fixed order: the same bits again.
    const Results again = run(s, Device::cuda);
    EXPECT_TRUE(bitwise_equal(again.dk, gpu.dk));
    EXPECT_TRUE(bitwise_equal(again.dq, gpu.dq));
  }
}

TEST(AttentionCuda, CudnnMatchesTheCpuWithinBf16) {
  ZAYA_SKIP_WITHOUT_GPU();
  std::string why;
  if (!cuda::cudnn_attention_available(&why)) GTEST_SKIP() << "cuDNN attention unavailable: " << why;
  const UseImpl use(cuda::AttentionImpl::cudnn);
  const Shape5 s = kShapes[1];
  const Results gpu = run(s, Device::cuda), cpu = run(s, Device::cpu);
  expect_close(gpu, cpu, kBf16Fwd, kBf16Lse, kBf16Bwd, "cuDNN");
  // Deterministic backward algorithm: the same bits again.
  const Results again = run(s, Device::cuda);
  EXPECT_TRUE(bitwise_equal(again.dq, gpu.dq));
  EXPECT_TRUE(bitwise_equal(again.dk, gpu.dk));
}

TEST(AttentionCuda, DecodeMatchesTheCpu) {
  ZAYA_SKIP_WITHOUT_GPU();
  // 3 batch rows, 2 q heads per kv head, 45 valid positions of a 64-position cache.
  const int64_t B = 3, S = 45, cap = 64, nq = 4, nkv = 2, hd = 72;
  Tensor q = random_tensor({B, nq, hd}, 1), kc = random_tensor({B, cap, nkv, hd}, 2),
         vc = random_tensor({B, cap, nkv, hd}, 3);
  Tensor out = Tensor::empty({B, nq, hd}, DType::f32), outg = gpu_empty({B, nq, hd});
  attention_decode(out, q, kc, vc, B, S, nq, nkv, hd);
  attention_decode(outg, on_gpu(q), on_gpu(kc), on_gpu(vc), B, S, nq, nkv, hd);
  EXPECT_LT(rel_diff(outg, out), kFwd);
}

// The cuDNN graphs the fronts build (ZAYA1-base's shape and the test's) pass cudnn-frontend's
// validation for a Hopper GPU: dims, strides, GQA, the causal mask, the statistics' layout and the
// deterministic backward. Needs libcudnn but no GPU, so it runs where the CUDA tests skip.
TEST(AttentionCuda, CudnnGraphsValidateForHopperWithoutAGpu) {
  const std::string zaya1 = cuda::cudnn_sdpa::validate_graphs(90, 1, 4096, 8, 2, 128);
  if (zaya1.find("could not be loaded") != std::string::npos ||
      zaya1.find("without cudnn-frontend") != std::string::npos)
    GTEST_SKIP() << "no cuDNN to validate with: " << zaya1;
  EXPECT_EQ(zaya1, "");
  EXPECT_EQ(cuda::cudnn_sdpa::validate_graphs(90, 1, 150, 8, 2, 128), "");
  EXPECT_EQ(cuda::cudnn_sdpa::validate_graphs(90, 3, 77, 4, 2, 64), "");
  // And the validation can fail: a head_dim beyond what cuDNN's flash attention takes.
  EXPECT_NE(cuda::cudnn_sdpa::validate_graphs(90, 1, 128, 8, 2, 1024), "");
}

// Without a GPU neither implementation can be chosen, and the error says why.
TEST(AttentionCuda, ChoosingCudnnWithoutItSaysWhy) {
  if (::zaya::cuda::device_count() > 0) GTEST_SKIP() << "a GPU is present: the no-GPU error cannot be checked";
  std::string why;
  EXPECT_FALSE(cuda::cudnn_attention_available(&why));
  EXPECT_FALSE(why.empty());
  const std::string msg = test::error_of([] { cuda::set_attention_impl(cuda::AttentionImpl::cudnn); });
  EXPECT_NE(msg.find("cuDNN attention was asked for, but "), std::string::npos) << msg;
}
}  // namespace
}  // namespace zaya::ops
#endif
