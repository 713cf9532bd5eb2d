// The split attention of an overlapped context-parallel chunk (attention_prefix_*, attention_merge)
// on each device against the CPU's attention_at over the whole key range, from the same random
// inputs: on the CPU it repeats test_attention_prefix.cc's check through the device-neutral path;
// on CUDA (the fp32 reference kernels with a key offset past every key, and the merge kernels) it
// is skipped with a message where no GPU is present (scripts/gpu_check.sh runs it on one).
//
// Tolerances, norm-wise relative, those of test_attention_at_cuda.cc and for the same reasons:
// forward 2e-5 (per-key online softmax on the GPU against tiles or rows on the CPU, exps an ulp or
// two apart), gradients 1e-4 (dS = P·(dP − D) subtracts nearly equal sums).
#include <gtest/gtest.h>

#include <string>

#include "ops/cuda_compare.h"
#include "zaya/ops/attention.h"

namespace zaya::ops {
namespace {

using test::on_gpu;
using test::random_tensor;
using test::rel_diff;

constexpr double kFwd = 2e-5, kBwd = 1e-4;

struct Chunk {
  int64_t B, Tq, Tk, nq, nkv, hd;  // Tq queries after Tk keys
};

struct Results {
  Tensor out, lse, dq, dk, dv;  // dk, dv over all Tk + Tq keys
};

Tensor host(const Tensor& t) { return t.device() == Device::cpu ? t : t.to(Device::cpu); }

// The whole chunk on the CPU: attention_at at q_pos = Tk against keys [0, Tk + Tq).
Results whole(const Chunk& c) {
  const int64_t N = c.Tk + c.Tq;
  const Tensor q = random_tensor({c.B, c.Tq, c.nq, c.hd}, 1), k = random_tensor({c.B, N, c.nkv, c.hd}, 2),
               v = random_tensor({c.B, N, c.nkv, c.hd}, 3), dout = random_tensor({c.B, c.Tq, c.nq, c.hd}, 4);
  Results r{Tensor::empty({c.B, c.Tq, c.nq, c.hd}, DType::f32), Tensor::empty({c.B, c.nq, c.Tq}, DType::f32),
            Tensor::empty({c.B, c.Tq, c.nq, c.hd}, DType::f32), Tensor::zeros({c.B, N, c.nkv, c.hd}, DType::f32),
            Tensor::zeros({c.B, N, c.nkv, c.hd}, DType::f32)};
  attention_at_forward(r.out, r.lse, q, k, v, c.B, c.Tq, N, c.Tk, c.nq, c.nkv, c.hd);
  attention_at_backward(r.dq, r.dk, r.dv, dout, q, k, v, r.out, r.lse, c.B, c.Tq, N, c.Tk, c.nq, c.nkv, c.hd);
  return r;
}

// The split on `device`: own keys (q_pos 0) and the keys before (prefix) as separate tensors, merged.
Results split(const Chunk& c, Device device) {
  const int64_t N = c.Tk + c.Tq;
  auto in = [&](const Tensor& t) { return device == Device::cuda ? on_gpu(t) : t; };
  auto empty = [&](const Shape& s) { return Tensor::empty(s, DType::f32, device); };
  auto zeros = [&](const Shape& s) { return Tensor::zeros(s, DType::f32, device); };
  const Tensor k = random_tensor({c.B, N, c.nkv, c.hd}, 2), v = random_tensor({c.B, N, c.nkv, c.hd}, 3);
  // Batch rows are [B, N, ...]: the own and prefix parts are taken row by row into their own tensors.
  Tensor k_own = Tensor::empty({c.B, c.Tq, c.nkv, c.hd}, DType::f32), v_own = k_own.clone();
  Tensor k_pre = Tensor::empty({c.B, c.Tk, c.nkv, c.hd}, DType::f32), v_pre = k_pre.clone();
  for (int64_t b = 0; b < c.B; ++b) {
    k_own.select(b).copy_from(k.select(b).slice(c.Tk, N));
    v_own.select(b).copy_from(v.select(b).slice(c.Tk, N));
    k_pre.select(b).copy_from(k.select(b).slice(0, c.Tk));
    v_pre.select(b).copy_from(v.select(b).slice(0, c.Tk));
  }
  const Tensor q = in(random_tensor({c.B, c.Tq, c.nq, c.hd}, 1)), dout = in(random_tensor({c.B, c.Tq, c.nq, c.hd}, 4));
  const Tensor ko = in(k_own), vo = in(v_own), kp = in(k_pre), vp = in(v_pre);
  Tensor out = empty({c.B, c.Tq, c.nq, c.hd}), lse = empty({c.B, c.nq, c.Tq}), ob = empty({c.B, c.Tq, c.nq, c.hd}),
         lb = empty({c.B, c.nq, c.Tq}), dq = empty({c.B, c.Tq, c.nq, c.hd});
  Tensor dko = zeros({c.B, c.Tq, c.nkv, c.hd}), dvo = zeros({c.B, c.Tq, c.nkv, c.hd}),
         dkp = zeros({c.B, c.Tk, c.nkv, c.hd}), dvp = zeros({c.B, c.Tk, c.nkv, c.hd});
  attention_at_forward(out, lse, q, ko, vo, c.B, c.Tq, c.Tq, 0, c.nq, c.nkv, c.hd);
  attention_prefix_forward(ob, lb, q, kp, vp, c.B, c.Tq, c.Tk, c.nq, c.nkv, c.hd);
  attention_merge(out, lse, ob, lb, c.B, c.Tq, c.nq, c.hd);
  attention_at_backward(dq, dko, dvo, dout, q, ko, vo, out, lse, c.B, c.Tq, c.Tq, 0, c.nq, c.nkv, c.hd);
  attention_prefix_backward(dq, dkp, dvp, dout, q, kp, vp, out, lse, c.B, c.Tq, c.Tk, c.nq, c.nkv, c.hd);
  // dk, dv back in [B, N] order.
  Results r{host(out), host(lse), host(dq), Tensor::empty({c.B, N, c.nkv, c.hd}, DType::f32),
            Tensor::empty({c.B, N, c.nkv, c.hd}, DType::f32)};
  const Tensor hko = host(dko), hvo = host(dvo), hkp = host(dkp), hvp = host(dvp);
  for (int64_t b = 0; b < c.B; ++b) {
    r.dk.select(b).slice(0, c.Tk).copy_from(hkp.select(b));
    r.dk.select(b).slice(c.Tk, N).copy_from(hko.select(b));
    r.dv.select(b).slice(0, c.Tk).copy_from(hvp.select(b));
    r.dv.select(b).slice(c.Tk, N).copy_from(hvo.select(b));
  }
  return r;
}

class AttentionPrefixOnDevice : public ::testing::TestWithParam<Device> {};

// GQA 2 and 4 q heads per kv head; prefixes on and off the CPU's 64-row tiles; a one-token chunk;
// ZAYA1's head dim 128.
const Chunk kChunks[] = {{2, 37, 50, 4, 2, 40}, {1, 64, 128, 8, 2, 128}, {3, 1, 5, 2, 1, 32}, {2, 24, 64, 4, 1, 64}};

TEST_P(AttentionPrefixOnDevice, SplitChunkMatchesTheCpuWholeChunk) {
  if (GetParam() == Device::cuda) ZAYA_SKIP_WITHOUT_GPU();
  for (const Chunk& c : kChunks) {
    SCOPED_TRACE(str("B ", c.B, " Tq ", c.Tq, " Tk ", c.Tk, " nq ", c.nq, " nkv ", c.nkv, " hd ", c.hd));
    const Results want = whole(c), got = split(c, GetParam());
    EXPECT_LT(rel_diff(got.out, want.out), kFwd) << "out";
    EXPECT_LT(rel_diff(got.lse, want.lse), kFwd) << "lse";
    EXPECT_LT(rel_diff(got.dq, want.dq), kBwd) << "dq";
    EXPECT_LT(rel_diff(got.dk, want.dk), kBwd) << "dk";
    EXPECT_LT(rel_diff(got.dv, want.dv), kBwd) << "dv";
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, AttentionPrefixOnDevice, ::testing::Values(Device::cpu, Device::cuda),
                         [](const auto& info) { return std::string(device_name(info.param)); });

}  // namespace
}  // namespace zaya::ops
