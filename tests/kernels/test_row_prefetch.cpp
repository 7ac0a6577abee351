// The GPU row kernels' prefetch switch (kernels/row_prefetch.h): the refill unless set, and nothing it
// changes on the CPU. The kernels that take it run on a GPU only: tests/cuda/test_cuda_row_prefetch.cpp.
#include <gtest/gtest.h>

#include <utility>

#include "kernels/fp8.h"
#include "kernels/nn_ops.h"
#include "kernels/row_prefetch.h"
#include "tests/testing.h"

namespace octet {
namespace {

using kernels::RowPrefetch;

TEST(RowPrefetch, IsTheRefillUnlessSet) {
  EXPECT_EQ(kernels::row_prefetch(), RowPrefetch::kRefill);
  kernels::set_row_prefetch(RowPrefetch::kAfter);
  EXPECT_EQ(kernels::row_prefetch(), RowPrefetch::kAfter);
  kernels::set_row_prefetch(RowPrefetch::kRefill);
  EXPECT_EQ(kernels::row_prefetch(), RowPrefetch::kRefill);
}

// The CPU's LayerNorm backward and FP8 cast give the same bits whatever the switch says.
TEST(RowPrefetch, LeavesTheCpuKernelsAlone) {
  const Tensor x = testing::random_tensor({70, 48}, DType::bf16, 1, 2.0);
  const Tensor dy = testing::random_tensor({70, 48}, DType::bf16, 2);
  const Tensor w = testing::random_tensor({48}, DType::f32, 3), b = testing::random_tensor({48}, DType::f32, 4);
  const auto fwd = kernels::layernorm_forward(x, w, b, 1e-5);
  auto run = [&] {
    const Tensor scale = full({1}, 20.0, DType::f32), amax = zeros({1}, DType::f32);
    return std::make_pair(kernels::layernorm_backward(dy, x, w, fwd.mean, fwd.rstd),
                          kernels::fp8_cast_dbias(dy, scale, amax, DType::e5m2, true, true, DType::bf16));
  };
  const auto refill = run();
  kernels::set_row_prefetch(RowPrefetch::kAfter);
  const auto after = run();
  kernels::set_row_prefetch(RowPrefetch::kRefill);
  EXPECT_TRUE(testing::same_bits(after.first.dx, refill.first.dx));
  EXPECT_TRUE(testing::same_bits(after.first.dweight, refill.first.dweight));
  EXPECT_TRUE(testing::same_bits(after.second.data, refill.second.data));
  EXPECT_TRUE(testing::same_bits(after.second.transposed, refill.second.transposed));
  EXPECT_TRUE(testing::same_bits(after.second.dbias, refill.second.dbias));
}

}  // namespace
}  // namespace octet
