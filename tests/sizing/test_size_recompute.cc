// `zaya size --recompute`: activation memory of the layer inputs plus one layer's saved activations,
// and the step priced with the re-run layer forwards.
#include <gtest/gtest.h>

#include <cstdio>

#include "sizing/zaya1_base_shape.h"
#include "zaya/model/params.h"
#include "zaya/sizing/hardware.h"
#include "zaya/sizing/size_report.h"

namespace zaya::sizing {
namespace {

TEST(SizeRecompute, ActivationsShrinkToInputsPlusOneLayerAndTheStepGrows) {
  const HardwareProfile h100 = builtin_profile("h100");
  RunShape run;
  run.mbs = 1;
  run.seq = 4096;
  for (int L : {1, 8, 40}) {
    SCOPED_TRACE(testing::Message() << L << " layers");
    const model::ModelConfig c = test::zaya1_base_shape(L);
    const SizeReport plain = size_model(c, run, h100);
    RunShape rc_run = run;
    rc_run.recompute = true;
    const SizeReport rc = size_model(c, rc_run, h100);
    // Weights, gradients and optimizer state do not move; model FLOPs neither.
    EXPECT_EQ(rc.memory.weights, plain.memory.weights);
    EXPECT_EQ(rc.memory.optimizer, plain.memory.optimizer);
    EXPECT_EQ(rc.flops_per_token, plain.flops_per_token);
    if (L == 1) {  // nothing to recompute: the one layer's activations are needed anyway
      EXPECT_EQ(rc.memory.activations, plain.memory.activations);
      EXPECT_EQ(rc.recompute_flops_per_token, 0.0);
      continue;
    }
    // A layer's saved activations are ~8x what it keeps with recompute at this shape (its fp32
    // input, bf16 router state, choice), so L layers' worth shrink to L small parts + one layer:
    // for 40 layers about 1/6; the bound allows kept/layer up to 0.2 and the ratio must stay above
    // the one-layer floor 1/L.
    const double ratio = rc.memory.activations / plain.memory.activations;
    const double layer = static_cast<double>(model::activation_bytes_per_token_per_layer(c, 2));
    EXPECT_GT(layer, 7.0 * 4.0 * static_cast<double>(c.hidden_size));
    EXPECT_LT(ratio, (1.0 + 0.2 * (L - 1)) / L) << ratio;
    EXPECT_GT(ratio, 1.0 / L) << ratio;
    std::printf("[ size     ] %d layers, seq 4096: activations %.2f -> %.2f GiB (%.3f), +%.1f%% FLOPs\n", L,
                plain.memory.activations / (1 << 30), rc.memory.activations / (1 << 30), ratio,
                100 * rc.recompute_flops_per_token / rc.flops_per_token);
    // The re-run forwards are (L−1)/L of the layers' forward FLOPs, a third of their training
    // FLOPs: the model's training FLOPs less the tied embedding/head's 6 per parameter.
    const double extra = rc.recompute_flops_per_token / rc.flops_per_token;
    const double layers_share = 1.0 - 6.0 * static_cast<double>(rc.embedding) / rc.flops_per_token;
    EXPECT_NEAR(extra, (L - 1.0) / L / 3.0 * layers_share, 1e-9);
    EXPECT_NEAR(rc.compute_time_s, plain.compute_time_s * (1.0 + extra), 1e-12 * plain.compute_time_s);
    EXPECT_LT(rc.mfu, plain.mfu);
    EXPECT_NE(format_size_report(rc).find("recompute      +"), std::string::npos);
  }
}

}  // namespace
}  // namespace zaya::sizing
