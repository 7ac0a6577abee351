// Tensor::set_data: PyTorch's `param.data = src`, which Module::to and FSDP's flat parameters use.
#include <gtest/gtest.h>

#include "autograd/ops.h"
#include "core/tensor.h"
#include "tests/testing.h"

namespace octet {
namespace {

using octet::testing::random_tensor;
using octet::testing::throws_with;

TEST(SetData, EveryHandleSeesTheNewDataAndAutogradStateStays) {
  Tensor param = random_tensor({2, 3}, DType::f32, 1);
  param.requires_grad_();
  const Tensor same_impl = param;  // what a Module's parameter list or an optimizer holds
  int hook_calls = 0;
  param.register_hook([&](const Tensor&) {
    ++hook_calls;
    return Tensor();
  });

  const Tensor replacement = random_tensor({3, 2}, DType::f64, 2);
  param.set_data(replacement);

  EXPECT_EQ(same_impl.shape(), (Shape{3, 2}));
  EXPECT_EQ(same_impl.dtype(), DType::f64);
  EXPECT_EQ(same_impl.storage(), replacement.storage());
  EXPECT_EQ(same_impl.to_vector<double>(), replacement.to_vector<double>());
  EXPECT_TRUE(same_impl.requires_grad());
  EXPECT_TRUE(same_impl.is_leaf());
  EXPECT_FALSE(replacement.requires_grad()) << "the source's own autograd state is untouched";

  // The hook registered before the swap still fires, and the gradient has the new shape.
  sum(mul(param, 3.0)).backward();
  EXPECT_EQ(hook_calls, 1);
  ASSERT_TRUE(param.grad().defined());
  EXPECT_EQ(param.grad().shape(), (Shape{3, 2}));
  EXPECT_EQ(param.grad().to_vector<double>(), std::vector<double>(6, 3.0));
}

TEST(SetData, KeepsTheSourceOffsetSoParametersCanLiveInOneFlatBuffer) {
  const Tensor flat = arange(0.0, 10.0, 1.0, DType::f32);
  Tensor a = zeros({2, 2}), b = zeros({3});
  a.set_data(flat.narrow(0, 4).reshape({2, 2}));
  b.set_data(flat.narrow(4, 3));
  EXPECT_EQ(b.storage_offset(), 4 * sizeof(float));
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{4, 5, 6}));
  flat.fill_(7.0);  // writes through the flat buffer reach both
  EXPECT_EQ(a.to_vector<float>(), std::vector<float>(4, 7.f));
  EXPECT_EQ(b.to_vector<float>(), std::vector<float>(3, 7.f));
}

TEST(SetData, RefusesNonLeavesUndefinedSourcesAndIntegerDataForGradTensors) {
  Tensor leaf = random_tensor({2}, DType::f32, 3);
  leaf.requires_grad_();
  const Tensor out = mul(leaf, 2.0);
  EXPECT_TRUE(
      throws_with([&] { out.set_data(zeros({2})); }, {"set_data", "output of an operation", "Detach"}));
  EXPECT_TRUE(throws_with([&] { leaf.set_data(Tensor()); }, {"set_data", "undefined"}));
  EXPECT_TRUE(throws_with([&] { leaf.set_data(zeros({2}, DType::i64)); }, {"set_data", "floating", "i64"}));
  EXPECT_TRUE(throws_with([] { Tensor().set_data(zeros({2})); }, {"set_data", "undefined"}));
}

}  // namespace
}  // namespace octet
