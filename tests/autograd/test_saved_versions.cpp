// A tensor an op saved for its backward and then written in place before backward: the backward must
// refuse, naming the op and the fix, where it would have read the new bytes and returned a wrong
// gradient silently (autograd/function.h, record()'s `saved`). Writes that cannot change a gradient
// stay allowed: to a tensor no op saved, or after the backward.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/grad_mode.h"
#include "kernels/elementwise.h"
#include "nn/layers.h"
#include "optim/optim.h"
#include "tests/testing.h"

namespace octet {
namespace {

using testing::random_tensor;
using testing::same_bits;
using testing::throws_with;

TEST(SavedVersions, AnOutputWrittenInPlaceBeforeBackwardIsRefused) {
  Tensor x = random_tensor({3, 4}).requires_grad_();
  const Tensor y = exp(x);  // exp's gradient reads its own output
  y.detach().fill_(0.0);
  EXPECT_TRUE(throws_with([&] { sum(y).backward(); },
                          {"'exp'", "[3, 4]", "modified in place", "version", "clone()", "after backward()"}));
}

TEST(SavedVersions, AnInputWrittenInPlaceBeforeBackwardIsRefused) {
  Tensor a = random_tensor({5}).requires_grad_();
  const Tensor b = random_tensor({5}, DType::f32, 2);
  const Tensor y = mul(a, b);  // a's gradient reads b
  kernels::mul_scalar_(b, 2.0);
  EXPECT_TRUE(throws_with([&] { sum(y).backward(); }, {"'mul'", "modified in place"}));
}

// An optimizer step between a forward and a second backward through the same graph changes the
// weights the first forward used: that backward is refused, not run on the stepped weights.
TEST(SavedVersions, AStepBetweenForwardAndARetainedBackwardIsRefused) {
  nn::Linear fc(4, 3);
  const Tensor x = random_tensor({2, 4}).requires_grad_();
  const Tensor loss = sum(fc(x));
  loss.backward(Tensor(), /*retain_graph=*/true);
  optim::SGD sgd(fc.parameters(), 0.1);
  sgd.step();
  EXPECT_TRUE(throws_with([&] { loss.backward(); }, {"'linear'", "modified in place"}));
}

// What no op saved may change: add keeps neither operand, so writing one after the forward leaves the
// gradient as it was; and every saved tensor may change once backward is done.
TEST(SavedVersions, WritesThatCannotChangeAGradientStayAllowed) {
  Tensor a = random_tensor({4}).requires_grad_();
  const Tensor b = random_tensor({4}, DType::f32, 3);
  const Tensor y = add(a, b);
  b.fill_(7.0);
  sum(y).backward();
  EXPECT_TRUE(same_bits(a.grad(), full({4}, 1.0)));

  Tensor x = random_tensor({4}, DType::f32, 4).requires_grad_();
  const Tensor e = exp(x);
  sum(e).backward();
  e.detach().fill_(0.0);  // after backward: nothing reads it any more
  const Tensor want = exp(x.detach());
  EXPECT_TRUE(same_bits(x.grad(), want));
}

// A node that saved its own output must not keep itself alive through it: a graph whose backward never
// runs (a loss computed without NoGradGuard and dropped, a backward that threw) is freed with its last
// handle. Each op here saves its output; a saved handle that carried the output's grad_fn would make a
// cycle and the node would outlive every handle.
TEST(SavedVersions, ANodeThatSavedItsOutputDiesWithItsLastHandle) {
  const Tensor x = random_tensor({2, 3, 4, 8}, DType::f32, 9).requires_grad_();
  const Tensor positive = add(mul(x, x), 1.0);
  const std::vector<std::pair<const char*, std::function<Tensor()>>> ops = {
      {"exp", [&] { return exp(x); }},
      {"tanh", [&] { return tanh(x); }},
      {"sqrt", [&] { return sqrt(positive); }},
      {"rsqrt", [&] { return rsqrt(positive); }},
      {"div", [&] { return div(x, positive); }},
      {"pow", [&] { return pow(positive, x); }},
      {"rdiv_scalar", [&] { return 2.0 / positive; }},
      {"softmax", [&] { return softmax(x, -1); }},
      {"log_softmax", [&] { return log_softmax(x, -1); }},
      {"add_layer_norm", [&] { return add_layer_norm(x, x, Tensor(), Tensor()).first; }},
      {"scaled_dot_product_attention", [&] { return scaled_dot_product_attention(x, x, x); }},
  };
  for (const auto& [name, op] : ops) {
    Tensor y = op();
    ASSERT_TRUE(y.grad_fn() != nullptr) << name;
    const std::weak_ptr<autograd::Node> node = y.grad_fn();
    y = Tensor();
    EXPECT_TRUE(node.expired()) << name << "'s node outlived its last handle";
  }
}

}  // namespace
}  // namespace octet
