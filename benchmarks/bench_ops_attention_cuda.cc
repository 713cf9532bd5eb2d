// The sequence ops on the GPU at ZAYA1-base's training shape. Causal GQA attention (8 query heads
// and 2 KV heads of 128 dims, 4,096 tokens, batch 1), forward and backward, for both CUDA
// implementations (the fp32 reference kernels and cuDNN's bf16 fused SDPA; docs/cuda.md,
// "Attention"). TFLOP/s count causal FLOPs as the flash-attention papers do: 4·B·nq·T²·hd/2 forward,
// 2.5× that backward (the fp32↔bf16 conversions around cuDNN are inside the timed call, as the model
// pays them). Each iteration ends with a stream synchronize; at milliseconds per call the launch and
// sync overhead is below 1%. Then the CCA ops and RoPE (GB/s, BM_CcaCuda below), whose calls take
// microseconds: 20 calls per synchronize there. Without a GPU every benchmark skips with the reason.
//   ./bench_ops_attention_cuda --benchmark_min_time=0.2   (scripts/gpu_check.sh run does this)
#include <benchmark/benchmark.h>

#include <string>

#include "zaya/core/cuda_context.h"
#include "zaya/core/cuda_runtime.h"
#include "stream_ref.h"
#include "zaya/ops/attention.h"
#include "zaya/ops/cca.h"
#include "zaya/ops/rope.h"
#if defined(ZAYA_HAVE_CUDA)
#include "zaya/ops/cuda/attention_cudnn.h"
#include "zaya/ops/cuda/sequence_cuda.h"
#endif

namespace {

using namespace zaya;

constexpr int64_t kB = 1, kT = 4096, kNq = 8, kNkv = 2, kHd = 128;

// Args: implementation (0 reference, 1 cuDNN), backward (0/1).
void BM_AttentionCuda(benchmark::State& st) {
#if defined(ZAYA_HAVE_CUDA)
  if (cuda::device_count() == 0) return st.SkipWithError(("no CUDA device: " + cuda::no_device_reason()).c_str());
  const auto impl = st.range(0) == 1 ? ops::cuda::AttentionImpl::cudnn : ops::cuda::AttentionImpl::reference;
  std::string why;
  if (impl == ops::cuda::AttentionImpl::cudnn && !ops::cuda::cudnn_attention_available(&why))
    return st.SkipWithError(("cuDNN attention unavailable: " + why).c_str());
  ops::cuda::set_attention_impl(impl);
  st.SetLabel(ops::cuda::attention_impl_name(impl));
  auto dev = [](const Shape& s, uint64_t seed) { return bench::random_normal(s, seed).to(Device::cuda); };
  auto empty = [](const Shape& s) { return Tensor::empty(s, DType::f32, Device::cuda); };
  Tensor q = dev({kB, kT, kNq, kHd}, 1), k = dev({kB, kT, kNkv, kHd}, 2), v = dev({kB, kT, kNkv, kHd}, 3);
  Tensor dout = dev({kB, kT, kNq, kHd}, 4), out = empty(q.shape()), lse = empty({kB, kNq, kT});
  Tensor dq = empty(q.shape()), dk = empty(k.shape()), dv = empty(v.shape());
  cuda::DeviceContext& ctx = cuda::current();
  const bool backward = st.range(1) == 1;
  auto call = [&] {
    if (backward) ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, kB, kT, kNq, kNkv, kHd);
    else ops::attention_forward(out, lse, q, k, v, kB, kT, kNq, kNkv, kHd);
  };
  ops::attention_forward(out, lse, q, k, v, kB, kT, kNq, kNkv, kHd);
  call();  // warm-up: cuDNN builds its graph for the shape on first use
  ctx.synchronize();
  for (auto _ : st) {
    call();
    ctx.synchronize();
  }
  const double flops = (backward ? 2.5 : 1.0) * 4.0 * kB * kNq * double(kT) * kT * kHd / 2;
  st.counters["TFLOP/s"] = benchmark::Counter(flops * 1e-12 * st.iterations(), benchmark::Counter::kIsRate);
#else
  st.SkipWithError("this build has no CUDA (configure with the 'cuda' preset)");
#endif
}
// The fp32↔bf16 conversions the cuDNN path makes around its kernels, alone (args: backward 0/1):
// forward q, k, v in and out back; backward q, k, v, O, dO in and dq, dk, dv back. cuDNN's own
// kernel time is BM_AttentionCuda's minus this.
void BM_AttentionCudnnConversions(benchmark::State& st) {
#if defined(ZAYA_HAVE_CUDA)
  if (cuda::device_count() == 0) return st.SkipWithError(("no CUDA device: " + cuda::no_device_reason()).c_str());
  const int64_t nq = kB * kT * kNq * kHd, nkv = kB * kT * kNkv * kHd;
  Tensor f32 = Tensor::zeros({2 * nq + 3 * nkv}, DType::f32).to(Device::cuda);
  Tensor b16 = Tensor::empty({2 * nq + 3 * nkv}, DType::bf16, Device::cuda);
  cuda::DeviceContext& ctx = cuda::current();
  const bool backward = st.range(0) == 1;
  // (elements in, elements out) of the conversions
  const int64_t in = backward ? 3 * nq + 2 * nkv : nq + 2 * nkv, out = backward ? nq + 2 * nkv : nq;
  for (auto _ : st) {
    ops::cuda::cudnn_sdpa::to_bf16(b16.raw(), f32.data<float>(), in, ctx.stream());
    ops::cuda::cudnn_sdpa::to_f32(f32.data<float>(), b16.raw(), out, ctx.stream());
    ctx.synchronize();
  }
  st.counters["GB/s"] = benchmark::Counter(6.0 * (in + out) * st.iterations(), benchmark::Counter::kIsRate);
#else
  st.SkipWithError("this build has no CUDA (configure with the 'cuda' preset)");
#endif
}
BENCHMARK(BM_AttentionCudnnConversions)
    ->ArgNames({"backward"})
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK(BM_AttentionCuda)
    ->ArgNames({"cudnn", "backward"})
    ->Args({0, 0})
    ->Args({0, 1})
    ->Args({1, 0})
    ->Args({1, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The CCA ops and RoPE at ZAYA1-base's shape (4,096 tokens, 8 + 2 heads of 128: C = 1,280
// channels), GB/s counting the tensors each op reads and writes once, as bench_ops_attention.cc
// does for the CPU: against the device's copy bandwidth (docs/cuda.md).
#if defined(ZAYA_HAVE_CUDA)
const ops::CcaDims kDims{kNq, kNkv, kHd};
Tensor dev_rnd(const Shape& s, uint64_t seed) { return bench::random_normal(s, seed).to(Device::cuda); }
Tensor dev_zeros(const Shape& s) { return Tensor::zeros(s, DType::f32).to(Device::cuda); }
ops::RopeTable dev_rope() {
  ops::RopeTable t = ops::make_rope_table(kHd, 0.5, 5e6, kT);
  t.cos = t.cos.to(Device::cuda);
  t.sin = t.sin.to(Device::cuda);
  return t;
}
ops::CcaConvWeights dev_conv_weights(bool zero) {
  const int64_t C = kDims.channels();
  auto make = [&](const Shape& s, uint64_t seed) { return zero ? dev_zeros(s) : dev_rnd(s, seed); };
  return {make({C, 1, 2}, 2), make({C}, 3), make({C, kHd, 2}, 4), make({C}, 5)};
}
// Runs `call` timed, kCallsPerSync calls per iteration and then a stream synchronize (a
// synchronize costs several microseconds, as long as one of these calls); `bytes` per call for GB/s.
constexpr int kCallsPerSync = 20;
template <class F>
void time_on_gpu(benchmark::State& st, double bytes, F&& call) {
  if (cuda::device_count() == 0) return st.SkipWithError(("no CUDA device: " + cuda::no_device_reason()).c_str());
  cuda::DeviceContext& ctx = cuda::current();
  call();
  ctx.synchronize();
  for (auto _ : st) {
    for (int i = 0; i < kCallsPerSync; ++i) call();
    ctx.synchronize();
  }
  st.counters["GB/s"] =
      benchmark::Counter(bytes * kCallsPerSync * 1e-9 * st.iterations(), benchmark::Counter::kIsRate);
  st.counters["us/call"] = benchmark::Counter(kCallsPerSync * st.iterations(),
                                              benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
#endif

void BM_CcaCuda(benchmark::State& st) {
#if defined(ZAYA_HAVE_CUDA)
  if (cuda::device_count() == 0) return st.SkipWithError(("no CUDA device: " + cuda::no_device_reason()).c_str());
  const int64_t N = kB * kT, C = kDims.channels(), rq = kNq * kHd, rk = kNkv * kHd;
  const double f4 = 4.0;  // bytes per float
  switch (st.range(0)) {
    case 0: {  // conv forward: z in, out
      Tensor z = dev_rnd({kB, kT, C}, 1), out = dev_zeros({kB, kT, C});
      const ops::CcaConvWeights w = dev_conv_weights(false);
      st.SetLabel("cca_conv_forward");
      return time_on_gpu(st, 2.0 * N * C * f4, [&] { ops::cca_conv_forward(out, z, w, kB, kT, kDims); });
    }
    case 1: {  // conv backward: z, dout in, dz out
      Tensor z = dev_rnd({kB, kT, C}, 1), dout = dev_rnd({kB, kT, C}, 6), dz = dev_zeros({kB, kT, C});
      const ops::CcaConvWeights w = dev_conv_weights(false), g = dev_conv_weights(true);
      st.SetLabel("cca_conv_backward");
      return time_on_gpu(st, 3.0 * N * C * f4, [&] { ops::cca_conv_backward(dz, g, dout, z, w, kB, kT, kDims); });
    }
    case 2: {  // the q/k path forward: conv, z in; q_pre, k_pre, q, k out
      const ops::RopeTable rope = dev_rope();
      Tensor conv = dev_rnd({N, C}, 1), z = dev_rnd({N, C}, 2), temp = dev_rnd({kNkv}, 3);
      Tensor q = dev_zeros({N, rq}), k = dev_zeros({N, rk}), qp = dev_zeros({N, rq}), kp = dev_zeros({N, rk});
      st.SetLabel("cca_qk_forward");
      return time_on_gpu(st, 4.0 * N * C * f4,
                         [&] { ops::cca_qk_forward(q, k, qp, kp, conv, z, temp, rope, kB, kT, kDims); });
    }
    case 3: {  // the q/k path backward: dq, dk, q_pre, k_pre in; dconv, dz out
      const ops::RopeTable rope = dev_rope();
      Tensor dq = dev_rnd({N, rq}, 1), dk = dev_rnd({N, rk}, 2), qp = dev_rnd({N, rq}, 3), kp = dev_rnd({N, rk}, 4);
      Tensor temp = dev_rnd({kNkv}, 5), dconv = dev_zeros({N, C}), dz = dev_zeros({N, C}), dtemp = dev_zeros({kNkv});
      st.SetLabel("cca_qk_backward");
      return time_on_gpu(st, 4.0 * N * C * f4, [&] {
        ops::cca_qk_backward(dconv, dz, dtemp, dq, dk, qp, kp, temp, rope, kB, kT, kDims);
      });
    }
    case 4: {  // RoPE in place on q: read and written
      const ops::RopeTable rope = dev_rope();
      Tensor x = dev_rnd({kB, kT, kNq, kHd}, 1);
      st.SetLabel("rope_forward (in place, q)");
      return time_on_gpu(st, 2.0 * N * rq * f4, [&] { ops::rope_forward(x, x, rope, kB, kT, kNq, kHd); });
    }
    default: {  // value shift: vcd in, v out
      const int64_t half = rk / 2;
      Tensor vcd = dev_rnd({kB, kT, 2 * half}, 1), v = dev_zeros({kB, kT, 2 * half});
      st.SetLabel("value_shift_forward");
      return time_on_gpu(st, 2.0 * N * rk * f4, [&] { ops::value_shift_forward(v, vcd, kB, kT, half); });
    }
  }
#else
  st.SkipWithError("this build has no CUDA (configure with the 'cuda' preset)");
#endif
}
BENCHMARK(BM_CcaCuda)->ArgNames({"op"})->DenseRange(0, 5)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
