// The GPU LayerNorm backward's design switch (kernels/layernorm_design.h): the row design unless set,
// and the CPU's one design whatever it says. The column design itself runs on a GPU only:
// tests/cuda/test_cuda_layernorm.cpp (CudaLayerNormBackwardColumns).
#include <gtest/gtest.h>

#include "kernels/layernorm_design.h"
#include "kernels/nn_ops.h"
#include "tests/testing.h"

namespace octet {
namespace {

using kernels::LayerNormBackwardDesign;

TEST(LayerNormBackwardDesign, IsTheRowDesignUnlessSet) {
  EXPECT_EQ(kernels::layernorm_backward_design(), LayerNormBackwardDesign::kRows);
  kernels::set_layernorm_backward_design(LayerNormBackwardDesign::kColumns);
  EXPECT_EQ(kernels::layernorm_backward_design(), LayerNormBackwardDesign::kColumns);
  kernels::set_layernorm_backward_design(LayerNormBackwardDesign::kRows);
  EXPECT_EQ(kernels::layernorm_backward_design(), LayerNormBackwardDesign::kRows);
}

TEST(LayerNormBackwardDesign, LeavesTheCpuKernelAlone) {
  const Tensor x = testing::random_tensor({9, 40}, DType::bf16, 1, 2.0), dy = testing::random_tensor({9, 40}, DType::bf16, 2);
  const Tensor w = testing::random_tensor({40}, DType::f32, 3), b = testing::random_tensor({40}, DType::f32, 4);
  const auto fwd = kernels::layernorm_forward(x, w, b, 1e-5);
  const auto rows = kernels::layernorm_backward(dy, x, w, fwd.mean, fwd.rstd);
  const int64_t launches = kernels::layernorm_backward_column_launches();
  kernels::set_layernorm_backward_design(LayerNormBackwardDesign::kColumns);
  const auto columns = kernels::layernorm_backward(dy, x, w, fwd.mean, fwd.rstd);
  EXPECT_EQ(kernels::layernorm_backward_column_launches(), launches) << "no GPU kernel for CPU tensors";
  kernels::set_layernorm_backward_design(LayerNormBackwardDesign::kRows);
  EXPECT_TRUE(testing::same_bits(columns.dx, rows.dx));
  EXPECT_TRUE(testing::same_bits(columns.dweight, rows.dweight));
  EXPECT_TRUE(testing::same_bits(columns.dbias, rows.dbias));
}

}  // namespace
}  // namespace octet
