// The model on the device against the model on the CPU: loss, every parameter gradient, the
// gradient-ready ranges and greedy generation, on several small random configs. On a GPU this is
// the CUDA kernels in the whole model's composition (fp32, TF32 off); without one it runs on the
// emulated device (tests/device_or_emulated.h), where every tensor the model touches must be on the
// device and the results are then bitwise the CPU's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "device_or_emulated.h"
#include "model/random_model.h"
#include "test_util.h"
#include "zaya/core/random.h"
#include "zaya/model/generate.h"
#include "zaya/model/params.h"
#include "zaya/model/zaya_model.h"

namespace zaya::model {
namespace {

using Dims = test::ModelDims;
ModelConfig make_config(const Dims& d) { return test::small_config(d, 64, 1000.0); }
// The router's weights ×3, so that routing depends on the input.
void randomize(ZayaModel& m, uint64_t seed) { test::randomize(m, seed, 3.0f); }

// ‖a − b‖ / ‖b‖ over a tensor, in double.
double rel_err(const Tensor& a_any, const Tensor& b) {
  const Tensor a = a_any.to(Device::cpu);
  const float* x = a.data<float>();
  const float* y = b.data<float>();
  double num = 0, den = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    num += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    den += double(y[i]) * y[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// GQA, a single kv head, an odd kv head count, a 3-layer router-state chain.
const Dims kDims[] = {
    {4, 2, 16, 4, 2, 16, 24, 32, 96},
    {4, 1, 32, 8, 3, 16, 32, 48, 64},
    {6, 3, 16, 3, 2, 8, 16, 32, 40},
};

Tensor random_ids(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Tensor u = Tensor::empty({B, T}, DType::f32), ids = Tensor::empty({B, T}, DType::i32);
  fill_uniform(u, seed, 0, 0.0f, static_cast<float>(V));
  for (int64_t i = 0; i < B * T; ++i)
    ids.data<int32_t>()[i] = std::min(static_cast<int32_t>(u.data<float>()[i]), static_cast<int32_t>(V - 1));
  return ids;
}

TEST(ModelDevice, LossAndEveryGradientMatchTheCpu) {
  ZAYA_GPU_OR_EMULATED(real);
  // fp32 on both devices (TF32 off): the GPU sums in other orders, so each tensor agrees to about
  // 1e-6 relative; 1e-4 is the bound and leaves room for the longest reductions. The
  // emulated device runs the CPU kernels: bitwise.
  const double tol = real ? 1e-4 : 0.0;
  const int64_t B = 2, T = 19;
  for (size_t k = 0; k < std::size(kDims); ++k) {
    const ModelConfig cfg = make_config(kDims[k]);
    ZayaModel cpu(cfg, B, T), dev(cfg, B, T, Device::cuda);
    randomize(cpu, 100 + k);
    Tensor(dev.params_flat()).copy_from(cpu.params_flat());
    Tensor(dev.balancing_biases()).copy_from(cpu.balancing_biases());
    const Tensor ids = random_ids(B, T, cfg.vocab_size, 11 + k), targets = random_ids(B, T, cfg.vocab_size, 31 + k);

    std::vector<std::pair<int64_t, int64_t>> cpu_ready, dev_ready;
    const double loss_cpu = cpu.forward(ids, targets);
    cpu.backward([&](int64_t a, int64_t b) { cpu_ready.emplace_back(a, b); });
    const double loss_dev = dev.forward(ids.to(Device::cuda), targets.to(Device::cuda));
    dev.backward([&](int64_t a, int64_t b) { dev_ready.emplace_back(a, b); });

    EXPECT_NEAR(loss_dev, loss_cpu, tol * std::abs(loss_cpu)) << "config " << k;
    EXPECT_EQ(dev_ready, cpu_ready) << "config " << k << ": the gradient-ready ranges differ";
    for (size_t i = 0; i < cpu.specs().size(); ++i) {
      const double e = rel_err(dev.grad(static_cast<int>(i)), cpu.grad(static_cast<int>(i)));
      EXPECT_LE(e, tol) << "config " << k << ", gradient of " << cpu.specs()[i].name;
    }
    // The routing the host sees (tokens per expert, one copy per layer).
    std::vector<int64_t> counts_cpu, counts_dev;
    cpu.add_expert_counts(counts_cpu);
    dev.add_expert_counts(counts_dev);
    EXPECT_EQ(counts_dev, counts_cpu) << "config " << k;

    // Activation recomputation on the device: the same gradients as without it, bitwise (the
    // re-run forward is the same computation on the same device).
    dev.set_recompute(true);
    const Tensor before = dev.grads_flat().to(Device::cpu);
    dev.zero_grad();
    dev.forward(ids.to(Device::cuda), targets.to(Device::cuda));
    dev.backward();
    const Tensor after = dev.grads_flat().to(Device::cpu);
    EXPECT_EQ(0, std::memcmp(after.raw(), before.raw(), before.nbytes())) << "config " << k << ", recompute";
  }
}

// The legacy skip passthrough (ModelConfig::skip_passthrough) on the device: its forward, both of
// its backward paths (into the normalized input, and through p_skip into the router, which runs
// as a side task of the experts' backward) and decoding, against the CPU. The skip class's bias is
// raised so that it wins for part of the tokens in every layer.
TEST(ModelDevice, SkipPassthroughLossGradientsAndGenerationMatchTheCpu) {
  ZAYA_GPU_OR_EMULATED(real);
  const double tol = real ? 1e-4 : 0.0;  // as LossAndEveryGradientMatchTheCpu
  ModelConfig cfg = make_config(kDims[0]);
  cfg.skip_passthrough = true;
  const int64_t B = 2, T = 19;
  ZayaModel cpu(cfg, B, T), dev(cfg, B, T, Device::cuda);
  test::randomize(cpu, 200, 1.0f);  // the router's weights unscaled: flatter probabilities, so
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l)  // a raised skip bias wins for part of the tokens
    cpu.balancing_biases().select(l).data<float>()[cfg.num_experts] += 0.1f;
  Tensor(dev.params_flat()).copy_from(cpu.params_flat());
  Tensor(dev.balancing_biases()).copy_from(cpu.balancing_biases());
  const Tensor ids = random_ids(B, T, cfg.vocab_size, 13), targets = random_ids(B, T, cfg.vocab_size, 33);

  const double loss_cpu = cpu.forward(ids, targets);
  cpu.backward();
  const double loss_dev = dev.forward(ids.to(Device::cuda), targets.to(Device::cuda));
  dev.backward();
  for (const RouterStats& st : cpu.router_stats()) {
    EXPECT_GT(st.skipped, 0) << "the skip class must win for some tokens in every layer";
    EXPECT_LT(st.skipped, B * T) << "and lose for some";
  }
  EXPECT_NEAR(loss_dev, loss_cpu, tol * std::abs(loss_cpu));
  for (size_t i = 0; i < cpu.specs().size(); ++i)
    EXPECT_LE(rel_err(dev.grad(static_cast<int>(i)), cpu.grad(static_cast<int>(i))), tol)
        << "gradient of " << cpu.specs()[i].name;

  const Tensor one = ids.slice(0, 1);
  ZayaModel cpu1(cfg, 1, T), dev1(cfg, 1, T, Device::cuda);
  Tensor(cpu1.params_flat()).copy_from(cpu.params_flat());
  Tensor(cpu1.balancing_biases()).copy_from(cpu.balancing_biases());
  Tensor(dev1.params_flat()).copy_from(cpu.params_flat());
  Tensor(dev1.balancing_biases()).copy_from(cpu.balancing_biases());
  GenerateOptions opt;
  opt.max_new = 12;
  EXPECT_EQ(generate(dev1, one, opt), generate(cpu1, one, opt));
}

// bf16 GEMM inputs (set_gemm_dtype) on both devices, with a chunked loss in one config (V = 9000 >
// the loss's 8192-column chunk). On a GPU the devices round the same f32 values to bf16 unless their
// f32 inputs differ in the last bits (other summation orders), which moves a rounding by one bf16 ulp
// at most: the bf16-against-fp32 bound of test_model_bf16.cc (4·√G·2^-8 per tensor, G = 16·L + 3
// GEMMs on a gradient's path) bounds the difference. Both assume the devices route alike (asserted:
// a near-tie in the router's logits could flip a token on a GPU). The emulated device runs the CPU
// kernels: bitwise.
TEST(ModelDevice, Bf16GemmsLossAndEveryGradientMatchTheCpu) {
  ZAYA_GPU_OR_EMULATED(real);
  const int64_t B = 2, T = 19;
  const Dims dims[] = {kDims[1], {4, 2, 16, 4, 2, 16, 24, 32, 9000}};
  for (size_t k = 0; k < std::size(dims); ++k) {
    const ModelConfig cfg = make_config(dims[k]);
    const double tol = real ? 4.0 * std::sqrt(16.0 * cfg.num_hidden_layers + 3.0) / 256.0 : 0.0;
    ZayaModel cpu(cfg, B, T), dev(cfg, B, T, Device::cuda);
    randomize(cpu, 200 + k);
    Tensor(dev.params_flat()).copy_from(cpu.params_flat());
    Tensor(dev.balancing_biases()).copy_from(cpu.balancing_biases());
    cpu.set_gemm_dtype(DType::bf16);
    dev.set_gemm_dtype(DType::bf16);
    const Tensor ids = random_ids(B, T, cfg.vocab_size, 41 + k),
                 targets = random_ids(B, T, cfg.vocab_size, 61 + k);
    const double loss_cpu = cpu.forward(ids, targets);
    cpu.backward();
    const double loss_dev = dev.forward(ids.to(Device::cuda), targets.to(Device::cuda));
    dev.backward();
    std::vector<int64_t> counts_cpu, counts_dev;
    cpu.add_expert_counts(counts_cpu);
    dev.add_expert_counts(counts_dev);
    ASSERT_EQ(counts_dev, counts_cpu) << "config " << k << ": the devices route differently";
    EXPECT_NEAR(loss_dev, loss_cpu, tol * std::abs(loss_cpu)) << "config " << k;
    for (size_t i = 0; i < cpu.specs().size(); ++i) {
      const double e = rel_err(dev.grad(static_cast<int>(i)), cpu.grad(static_cast<int>(i)));
      EXPECT_LE(e, tol) << "config " << k << ", gradient of " << cpu.specs()[i].name;
    }
  }
}

TEST(ModelDevice, LogitsAndGreedyGenerationMatchTheCpu) {
  ZAYA_GPU_OR_EMULATED(real);
  const double tol = real ? 1e-4 : 0.0;
  const ModelConfig cfg = make_config(kDims[0]);
  const int64_t T = 7;
  ZayaModel cpu(cfg, 1, T), dev(cfg, 1, T, Device::cuda);
  randomize(cpu, 5);
  Tensor(dev.params_flat()).copy_from(cpu.params_flat());
  Tensor(dev.balancing_biases()).copy_from(cpu.balancing_biases());
  const Tensor ids = random_ids(1, T, cfg.vocab_size, 3);

  Tensor lc = Tensor::empty({T, cfg.vocab_size}, DType::f32);
  Tensor ld = Tensor::empty({T, cfg.vocab_size}, DType::f32, Device::cuda);
  cpu.forward_logits(ids, lc);
  dev.forward_logits(ids.to(Device::cuda), ld);
  EXPECT_LE(rel_err(ld, lc), tol);

  GenerateOptions opt;
  opt.max_new = 12;
  // Greedy decoding compares argmaxes, which fp32 rounding can only flip on a near-tie: with these
  // random weights the top two logits are far apart, so the tokens must match exactly.
  EXPECT_EQ(generate(dev, ids, opt), generate(cpu, ids, opt));
}

TEST(ModelDevice, HostCodeCannotReachDeviceMemory) {
  ZAYA_GPU_OR_EMULATED(real);
  if (real) GTEST_SKIP() << "only the emulated device can tell host access apart (a GPU would fault)";
  Tensor t = Tensor::zeros({4}, DType::f32, Device::cuda);
  const std::string msg = test::error_of([&] { t.data<float>()[0] = 1.0f; });
  EXPECT_NE(msg.find("outside an op"), std::string::npos) << msg;
  // Copies are the way across.
  Tensor h = Tensor::zeros({4}, DType::f32);
  h.data<float>()[2] = 3.0f;
  t.copy_from(h);
  EXPECT_EQ(t.to(Device::cpu).data<float>()[2], 3.0f);
}

}  // namespace
}  // namespace zaya::model
