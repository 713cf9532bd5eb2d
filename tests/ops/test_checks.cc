// The op fronts' shared checks (ops/checks.h): which device a call runs on, and the messages of
// the device and argument errors. The per-family tests check each front's use of them.
#include <gtest/gtest.h>

#include <vector>

#include "ops/device_dispatch.h"
#include "zaya/ops/checks.h"

namespace zaya::ops {
namespace {

using test::error_of;

TEST(OpDevice, UndefinedArgumentsAreSkipped) {
  Tensor x = Tensor::zeros({2, 3}, DType::f32);
  const Tensor none;
  const OpDevice on_cpu("some_op", {{"bias", none}, {"x", x}});
  EXPECT_TRUE(on_cpu.cpu());
  test::CudaLabelled cu;
  const Tensor xc = cu({2, 3});
  const OpDevice on_cuda("some_op", {{"bias", none}, {"x", xc}, {"dx", none}});
  EXPECT_TRUE(on_cuda.cuda());
  // The first defined argument is the one the message shows.
  EXPECT_EQ(error_of([&] { on_cuda.no_kernel(); }), "no CUDA kernel for ops::some_op yet (x is f32[2, 3] cuda)");
}

TEST(OpDevice, ListsAndAddedArgumentsAreNamedByIndex) {
  test::CudaLabelled cu;
  const std::vector<Tensor> grads{cu({4}), cu({2, 2}), Tensor::zeros({3}, DType::f32)};
  EXPECT_EQ(error_of([&] { OpDevice("norm", "gradient", grads); }),
            "norm: gradient 2 is f32[3] cpu, but gradient 0 is f32[4] cuda: every tensor of one call must be on "
            "the same device");
  OpDevice on("grouped");
  on.add("problems", 0, ".A", cu({2, 2}));
  on.add("problems", 0, ".C", cu({2, 2}));
  const Tensor B1 = Tensor::zeros({2, 2}, DType::f32);
  EXPECT_EQ(error_of([&] { on.add("problems", 1, ".B", B1); }),
            "grouped: problems[1].B is f32[2, 2] cpu, but problems[0].A is f32[2, 2] cuda: every tensor of one "
            "call must be on the same device");
  // A call with no tensor at all runs on the CPU, and a missing kernel is still named.
  const OpDevice empty("nothing");
  EXPECT_TRUE(empty.cpu());
  EXPECT_EQ(error_of([&] { empty.no_kernel(); }), "no CPU kernel for ops::nothing yet");
}

TEST(Checks, MessagesNameTheOpTheArgumentAndWhatWasFound) {
  test::CudaLabelled cu;
  const Tensor x = cu({2, 3}, DType::bf16), none;
  EXPECT_EQ(error_of([&] { check::defined("op", "w", none); }), "op: w is not defined");
  EXPECT_EQ(error_of([&] { check::f32("op", "x", x); }), "op: x must be f32, found bf16[2, 3] cuda");
  EXPECT_EQ(error_of([&] { check::positive("op", "T", 0); }), "op: T must be positive, found 0");
  const Tensor y = cu({2, 3});
  EXPECT_NE(error_of([&] { check::exact("op", "y", y, Shape{3, 2}); }).find("[3, 2]"), std::string::npos);
  // The row forms: [B, T, F], [B·T, F] and [B, T, heads, hd] are all B·T rows of F.
  EXPECT_EQ(error_of([&] { check::rows("op", "y", y, 1, 2, 3); }), "");
  EXPECT_EQ(error_of([&] { check::rows("op", "y", cu({1, 2, 3}), 1, 2, 3); }), "");
  EXPECT_EQ(error_of([&] { check::rows("op", "y", cu({1, 2, 3, 1}), 1, 2, 3); }), "");
  EXPECT_NE(error_of([&] { check::rows("op", "y", cu({2, 2, 3}), 1, 2, 3); }), "");
  EXPECT_EQ(error_of([&] { check::n_rows("op", "y", cu({1, 2, 3}), 2, 3); }), "");
  EXPECT_NE(error_of([&] { check::n_rows("op", "y", y, 3, 2); }), "");
}

}  // namespace
}  // namespace zaya::ops
