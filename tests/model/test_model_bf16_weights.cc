// bf16 weight storage (ZayaModel::store_weights_bf16, train.param_dtype = "bf16"): the model keeps
// its weights in a bf16 buffer, the GEMMs read them as stored and the f32 ops read widened copies of
// the few small parameters. The reference is the same model with f32 storage holding the same bf16
// values and bf16 GEMMs: every op then sees the same numbers (the bf16 GEMM operands are the same
// bits, the widened small parameters and embedding rows are exact), so the loss and every gradient
// are bitwise the same; only the memory differs, by exactly the f32 buffer it frees.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "device_or_emulated.h"
#include "model/random_model.h"
#include "zaya/core/error.h"
#include "zaya/model/generate.h"
#include "zaya/ops/dense.h"
#include "zaya/ops/loss.h"

namespace zaya::model {
namespace {

ModelConfig small() {
  return test::small_config({.nq = 4, .nkv = 2, .hd = 16, .E = 4, .L = 3, .R = 16, .I = 24, .H = 32, .V = 96}, 64);
}

std::vector<float> host_floats(const Tensor& t) {
  const Tensor h = t.to(Device::cpu);
  return {h.data<float>(), h.data<float>() + h.numel()};
}

struct Step {
  double loss;
  std::vector<float> grads;
};

Step train_step(ZayaModel& m, const Tensor& ids, const Tensor& tg) {
  m.zero_grad();
  Step s;
  s.loss = m.forward(ids, tg);
  m.backward();
  s.grads = host_floats(m.grads_flat());
  return s;
}

Tensor tokens(int64_t B, int64_t T, int64_t V, uint64_t seed, Device device) {
  Tensor t = Tensor::empty(Shape{B, T}, DType::i32);
  for (int64_t i = 0; i < B * T; ++i) t.data<int32_t>()[i] = static_cast<int32_t>((i * 37 + seed * 11) % V);
  return t.to(device);
}

// Model `stored` keeps bf16 weights; `reference` the same values in f32 storage. Both bf16 GEMMs.
struct Pair {
  std::unique_ptr<ZayaModel> reference, stored;
};

Pair make_pair(Device device, bool recompute) {
  Pair p;
  ZayaModel host(small(), 2, 16);  // randomized on the host, copied to the device
  test::randomize(host, 5, 3.0f);
  for (auto* m : {&p.reference, &p.stored}) {
    *m = std::make_unique<ZayaModel>(small(), 2, 16, device);
    Tensor((*m)->params_flat()).copy_from(host.params_flat());
    Tensor((*m)->balancing_biases()).copy_from(host.balancing_biases());
    (*m)->set_gemm_dtype(DType::bf16);
    (*m)->set_recompute(recompute);
  }
  // The reference's f32 weights become the bf16 values the other model stores.
  const Tensor& w = p.reference->params_flat();
  Tensor w16 = Tensor::empty(w.shape(), DType::bf16, device);
  ops::cast_to_bf16(w16, w);
  ops::cast_to_f32(w, w16);
  p.stored->store_weights_bf16();
  return p;
}

void expect_bitwise_the_reference(Device device) {
  for (bool recompute : {false, true}) {
    SCOPED_TRACE(recompute ? "recompute" : "saved activations");
    Pair p = make_pair(device, recompute);
    ASSERT_EQ(p.stored->weight_dtype(), DType::bf16);
    for (uint64_t k = 0; k < 2; ++k) {  // twice: the second forward reuses the widened copies' buffers
      const Tensor ids = tokens(2, 16, 96, k, device), tg = tokens(2, 16, 96, k + 7, device);
      const Step a = train_step(*p.reference, ids, tg), b = train_step(*p.stored, ids, tg);
      EXPECT_EQ(a.loss, b.loss) << "pass " << k;
      ASSERT_EQ(a.grads.size(), b.grads.size());
      EXPECT_EQ(std::memcmp(a.grads.data(), b.grads.data(), a.grads.size() * 4), 0)
          << "pass " << k << ": some gradient differs in some bit";
    }
  }
}

TEST(Bf16WeightStorage, TrainsBitwiseAsF32StorageOfTheSameValues) { expect_bitwise_the_reference(Device::cpu); }

// On a GPU the two models' GEMMs see the same bf16 bits; on the emulated device the same CPU kernels.
TEST(Bf16WeightStorage, TrainsBitwiseAsF32StorageOfTheSameValuesOnTheDevice) {
  ZAYA_GPU_OR_EMULATED(real);
  expect_bitwise_the_reference(Device::cuda);
}

// The weights are stored once, in 2 bytes each; the f32 buffer is freed, and only the small
// parameters' widened copy (4 bytes each) is added: zaya's tensor storage changes by exactly that.
TEST(Bf16WeightStorage, HalvesTheWeightsMemory) {
  ZayaModel m(small(), 2, 16);
  test::randomize(m, 5);
  m.set_gemm_dtype(DType::bf16);
  const int64_t P = m.params_flat().numel();
  int64_t small_params = 0;
  for (const ParamSpec& s : m.specs())
    if (!s.is_gemm_weight()) small_params += s.shape.numel();
  ASSERT_GT(small_params, 0);
  const size_t before = storage_bytes_in_use(Device::cpu);
  m.store_weights_bf16();
  const size_t after = storage_bytes_in_use(Device::cpu);
  EXPECT_EQ(static_cast<int64_t>(after) - static_cast<int64_t>(before), 4 * small_params - 2 * P);
  EXPECT_EQ(m.params_flat().nbytes(), static_cast<size_t>(2 * P));
  EXPECT_EQ(m.param(0).dtype(), DType::bf16);
  EXPECT_EQ(m.grads_flat().dtype(), DType::f32) << "gradients stay f32";
}

// With no f32 embedding left, evaluation and the logits take the head's GEMM in bf16 as training
// does: the evaluation loss is the training forward's, bitwise, and the logits give that loss.
TEST(Bf16WeightStorage, EvaluationAndLogitsUseTheBf16Head) {
  Pair p = make_pair(Device::cpu, false);
  ZayaModel& m = *p.stored;
  const Tensor ids = tokens(2, 16, 96, 3, Device::cpu), tg = tokens(2, 16, 96, 4, Device::cpu);
  const double eval = m.forward(ids, tg, /*for_backward=*/false);
  const double train = m.forward(ids, tg, /*for_backward=*/true);
  EXPECT_EQ(eval, train);
  Tensor logits = Tensor::empty(Shape{32, 96}, DType::f32);
  m.forward_logits(ids, logits);
  Tensor lse = Tensor::empty(Shape{32}, DType::f32);
  // One vocabulary chunk: the logits op's row math is the fused head's, bit for bit (ops/loss.h).
  EXPECT_EQ(ops::cross_entropy_logits_forward(lse, logits, tg).loss, eval);
}

TEST(Bf16WeightStorage, RefusesWhatNeedsF32Weights) {
  ZayaModel f32_gemms(small(), 2, 16);
  f32_gemms.init(1);
  EXPECT_THROW(f32_gemms.store_weights_bf16(), Error) << "bf16 weights need bf16 GEMMs";
  EXPECT_EQ(f32_gemms.weight_dtype(), DType::f32) << "a refused call changes nothing";

  Pair p = make_pair(Device::cpu, false);
  ZayaModel& m = *p.stored;
  EXPECT_THROW(m.store_weights_bf16(), Error) << "stored twice";
  EXPECT_THROW(m.init(2), Error) << "init writes f32 weights";
  EXPECT_THROW(m.set_gemm_dtype(DType::f32), Error) << "f32 GEMMs on bf16 weights";
  EXPECT_THROW(ZayaDecoder(m, 1, 8), Error) << "decode reads f32 weights";
}

}  // namespace
}  // namespace zaya::model
