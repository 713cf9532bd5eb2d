// Causal GQA attention on the GPU at ZAYA1-base's training shape (8 query heads and 2 KV heads of
// 128 dims, 4,096 tokens, batch 1), forward and backward, for both CUDA implementations (the fp32
// reference kernels and cuDNN's bf16 fused SDPA; docs/cuda.md, "Attention"). TFLOP/s count causal
// FLOPs as the flash-attention papers do: 4·B·nq·T²·hd/2 forward, 2.5× that backward (the fp32↔bf16
// conversions around cuDNN are inside the timed call, as the model pays them). Each iteration ends
// with a stream synchronize; at milliseconds per call the launch and sync overhead is below 1%.
//   ./bench_ops_attention_cuda --benchmark_min_time=0.2   (scripts/gpu_check.sh run does this)
// Without a GPU every benchmark skips with the reason.
#include <benchmark/benchmark.h>

#include <string>

#include "zaya/core/cuda_context.h"
#include "zaya/core/cuda_runtime.h"
#include "stream_ref.h"
#include "zaya/ops/attention.h"
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
BENCHMARK(BM_AttentionCudnnConversions)->ArgNames({"backward"})->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK(BM_AttentionCuda)
    ->ArgNames({"cudnn", "backward"})
    ->Args({0, 0})
    ->Args({0, 1})
    ->Args({1, 0})
    ->Args({1, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
