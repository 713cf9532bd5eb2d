// ops::copy_block: the block lands where it should and nothing else changes; bad blocks and
// mismatched tensors are errors naming the op and the tensor; without a GPU, CUDA tensors make
// copy_block and add_block say so (add_block's CPU arithmetic: test_attention_at.cc).
#include <gtest/gtest.h>

#include <vector>

#include "ops/device_dispatch.h"
#include "zaya/core/error.h"
#include "zaya/ops/copy.h"

namespace zaya::ops {
namespace {

Tensor counting(const Shape& s, float base) {
  Tensor t = Tensor::empty(s, DType::f32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = base + static_cast<float>(i);
  return t;
}

TEST(CopyBlock, CopiesTheBlockAndNothingElse) {
  // src seen as [6, 5] (a [2, 3, 5] tensor), dst as [4, 7].
  const Tensor src = counting({2, 3, 5}, 0), dst = counting({4, 7}, 1000);
  copy_block(dst, 1, 2, src, 3, 1, 2, 4);
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t c = 0; c < 7; ++c) {
      const bool in = r >= 1 && r < 3 && c >= 2 && c < 6;
      const float want = in ? static_cast<float>((r - 1 + 3) * 5 + (c - 2 + 1)) : 1000.0f + static_cast<float>(r * 7 + c);
      EXPECT_EQ(dst.data<float>()[r * 7 + c], want) << r << ", " << c;
    }
  // Whole rows: one contiguous copy.
  const Tensor d2 = counting({3, 5}, 500);
  copy_block(d2, 1, 0, src, 4, 0, 2, 5);
  for (int64_t j = 0; j < 10; ++j) EXPECT_EQ(d2.data<float>()[5 + j], static_cast<float>(20 + j));
  EXPECT_EQ(d2.data<float>()[4], 504.0f);
}

TEST(CopyBlock, BadBlocksAndTensorsNameTheOp) {
  const Tensor src = counting({6, 5}, 0), dst = counting({4, 7}, 0);
  const std::string past = test::error_of([&] { copy_block(dst, 3, 0, src, 0, 0, 2, 3); });
  EXPECT_NE(past.find("copy_block: the block [3, 5) x [0, 3) is outside dst"), std::string::npos) << past;
  const std::string src_past = test::error_of([&] { copy_block(dst, 0, 0, src, 0, 3, 1, 3); });
  EXPECT_NE(src_past.find("outside src"), std::string::npos) << src_past;
  const Tensor ints = Tensor::zeros({4, 7}, DType::i32);
  EXPECT_NE(test::error_of([&] { copy_block(ints, 0, 0, src, 0, 0, 1, 1); }).find("copy_block"), std::string::npos);
  test::CudaLabelled cu;
  test::expect_mixed_devices("copy_block", "src", [&] { copy_block(dst, 0, 0, test::as_cuda(src), 0, 0, 1, 1); });
  // Where no GPU is present the CUDA kernel (cuda/copy.cu) says so, naming the op (with a GPU,
  // test_optim_cuda.cc copies device memory).
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is present: test_optim_cuda.cc runs copy_block on it";
  test::expect_needs_gpu("copy_block", [&] { copy_block(cu({4, 7}), 0, 0, cu({6, 5}), 0, 0, 1, 1); });
  test::expect_needs_gpu("add_block", [&] { add_block(cu({4, 7}), 0, 0, cu({6, 5}), 0, 0, 1, 1); });
}

}  // namespace
}  // namespace zaya::ops
