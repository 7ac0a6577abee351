// The backward engine on graphs built from test-local differentiable functions (record() over
// kernels), so these tests exercise the engine apart from autograd/ops.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"
#include "tests/testing.h"

namespace octet {
namespace {

using autograd::Grads;
using autograd::record;
using octet::testing::throws_with;

Tensor leaf(std::vector<double> values) {
  return from_vector(values, {static_cast<int64_t>(values.size())}, DType::f64).requires_grad_();
}

// y = a * b (same shapes)
Tensor times(const Tensor& a, const Tensor& b) {
  return record("times", kernels::mul(a, b), {a, b}, [a = a.detach(), b = b.detach()](const Grads& g) -> Grads {
    return {kernels::mul(g[0], b), kernels::mul(g[0], a)};
  });
}
// y = a + b (same shapes)
Tensor plus(const Tensor& a, const Tensor& b) {
  return record("plus", kernels::add(a, b), {a, b}, [](const Grads& g) -> Grads { return {g[0], g[0]}; });
}
// y = sum(a)
Tensor total(const Tensor& a) {
  return record("total", kernels::sum(a), {a}, [shape = a.shape()](const Grads& g) -> Grads {
    return {kernels::broadcast_to(g[0], shape)};
  });
}
// Two outputs: (2a, 3a).
std::vector<Tensor> two_scales(const Tensor& a) {
  return record("two_scales", {kernels::mul_scalar(a, 2), kernels::mul_scalar(a, 3)}, {a},
                [](const Grads& g) -> Grads { return {kernels::add(kernels::mul_scalar(g[0], 2), kernels::mul_scalar(g[1], 3))}; });
}

TEST(Engine, ChainRuleOnALine) {
  Tensor x = leaf({1, 2, 3});
  total(times(x, x)).backward();  // d/dx sum(x^2) = 2x
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2, 4, 6}));
}

TEST(Engine, DiamondGraphSumsBothPaths) {
  Tensor x = leaf({1, -2});
  Tensor w = leaf({3, 5});
  Tensor a = times(x, w);   // x w
  Tensor b = times(x, x);   // x^2
  Tensor c = plus(a, b);    // meets again
  total(times(c, a)).backward();  // L = sum((xw + x^2) xw); dL/dx = (w + 2x) xw + (xw + x^2) w
  const std::vector<double> xv{1, -2}, wv{3, 5};
  for (int i = 0; i < 2; ++i) {
    const double x0 = xv[i], w0 = wv[i];
    EXPECT_DOUBLE_EQ(x.grad().to_vector<double>()[i], (w0 + 2 * x0) * x0 * w0 + (x0 * w0 + x0 * x0) * w0);
    EXPECT_DOUBLE_EQ(w.grad().to_vector<double>()[i], x0 * x0 * w0 + (x0 * w0 + x0 * x0) * x0);
  }
}

TEST(Engine, TensorUsedTwiceInOneOpGetsBothGradients) {
  Tensor x = leaf({4});
  total(plus(x, x)).backward();
  EXPECT_EQ(x.grad().item(), 2.0);
}

TEST(Engine, GradientsAccumulateAcrossBackwardCalls) {
  Tensor x = leaf({1, 2});
  total(times(x, x)).backward();
  total(times(x, x)).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{4, 8}));
  x.set_grad(Tensor());
  total(x).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{1, 1}));
}

TEST(Engine, LeavesNeverShareAGradientBuffer) {
  // plus() hands the same gradient tensor to both inputs; accumulating into one must not touch the other.
  Tensor a = leaf({1}), b = leaf({1});
  total(plus(a, b)).backward();
  total(times(a, a)).backward();
  EXPECT_EQ(a.grad().item(), 3.0);
  EXPECT_EQ(b.grad().item(), 1.0);
}

TEST(Engine, NoGradRecordsNothing) {
  Tensor x = leaf({1, 2});
  {
    NoGradGuard no_grad;
    Tensor y = times(x, x);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_EQ(y.grad_fn(), nullptr);
    {
      EnableGradGuard enable;
      EXPECT_TRUE(times(x, x).requires_grad());
    }
  }
  EXPECT_TRUE(GradMode::is_enabled());
  Tensor plain = from_vector<double>({1, 2}, {2});
  EXPECT_FALSE(times(plain, plain).requires_grad());
  EXPECT_THROW(total(times(plain, plain)).backward(), Error);
}

TEST(Engine, RetainGraphAllowsASecondBackwardAndItsAbsenceExplainsItself) {
  Tensor x = leaf({3});
  Tensor y = total(times(x, x));
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();
  EXPECT_EQ(x.grad().item(), 12.0);
  try {
    y.backward();
    FAIL() << "a freed graph must not run again";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("retain_graph"), std::string::npos) << e.what();
  }
}

TEST(Engine, NonScalarRootNeedsAnExplicitGradient) {
  Tensor x = leaf({1, 2, 3});
  Tensor y = times(x, x);
  EXPECT_THROW(y.backward(), Error);
  y.backward(from_vector<double>({1, 0, -1}, {3}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2, 0, -6}));
}

TEST(Engine, OutputsWithoutGradientsReceiveZeros) {
  Tensor x = leaf({1, 2});
  std::vector<Tensor> outs = two_scales(x);
  total(outs[1]).backward();  // outs[0] unused: its gradient is materialised as zeros
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{3, 3}));
}

TEST(Engine, TensorHooksSeeAndReplaceGradients) {
  Tensor x = leaf({1, 2});
  Tensor y = times(x, x);
  std::vector<double> seen;
  y.register_hook([&](const Tensor& g) {
    seen = g.to_vector<double>();
    return kernels::mul_scalar(g, 10);  // scales everything upstream
  });
  total(y).backward();
  EXPECT_EQ(seen, (std::vector<double>{1, 1}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{20, 40}));
}

// A hook's replacement stands for the gradient: one of another shape is refused naming the op, where
// it used to reach the op's closure (or a leaf's accumulation) and fail there, or not at all. A hook
// that registers another on the same tensor no longer walks a list that grows under it.
TEST(Engine, AHookReplacementMustLookLikeTheGradient) {
  Tensor x = leaf({1, 2});
  Tensor y = times(x, x);
  y.register_hook([](const Tensor&) { return from_vector<double>({1, 2, 3}, {3}); });
  EXPECT_TRUE(throws_with([&] { total(y).backward(); }, {"hook on output 0", "'times'", "[3]", "shape [2]"}));

  Tensor a = leaf({1, 2});
  Tensor b = times(a, a);
  int later_calls = 0;
  b.register_hook([&](const Tensor& g) {
    for (int i = 0; i < 40; ++i) {
      Tensor(b).register_hook([&](const Tensor&) {
        ++later_calls;
        return Tensor();
      });
    }
    return g;
  });
  total(b).backward();
  EXPECT_EQ(later_calls, 0) << "hooks registered during the pass wait for the next one";
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{2, 4}));

  Tensor w = leaf({2});
  int post_calls = 0;
  w.register_post_accumulate_grad_hook([&](Tensor& p) {
    ++post_calls;
    for (int i = 0; i < 40; ++i) w.register_post_accumulate_grad_hook([](Tensor&) {});
    p = Tensor();  // rebinding the argument leaves the leaf and its node alone
  });
  total(times(w, w)).backward();
  total(times(w, w)).backward();
  EXPECT_EQ(post_calls, 2);
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{8}));
}

TEST(Engine, HooksOnADroppedIntermediateStillFire) {
  Tensor x = leaf({1});
  int calls = 0;
  Tensor loss;
  {
    Tensor y = times(x, x);
    y.register_hook([&](const Tensor&) {
      ++calls;
      return Tensor();
    });
    loss = total(y);
  }  // y's handle is gone; its hook lives on with the graph
  loss.backward();
  EXPECT_EQ(calls, 1);
}

TEST(Engine, PostAccumulateHookFiresOncePerBackwardWithTheFullGradient) {
  Tensor w = leaf({2});
  std::vector<double> seen;
  w.register_post_accumulate_grad_hook([&](Tensor& p) { seen.push_back(p.grad().item()); });
  Tensor x = from_vector<double>({3}, {1});
  // w used three times: in w*x, in w*w, and again in plus.
  total(plus(times(w, x), times(w, w))).backward();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], 3.0 + 4.0);
  total(times(w, x)).backward();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1], 7.0 + 3.0);  // sees the accumulated .grad
}

TEST(Engine, RunsNodesInReverseCreationOrder) {
  // Three independent parameters used in order; their accumulators must fire last-used first,
  // the order DDP's buckets are filled in.
  Tensor p1 = leaf({1}), p2 = leaf({1}), p3 = leaf({1});
  std::vector<int> order;
  p1.register_post_accumulate_grad_hook([&](Tensor&) { order.push_back(1); });
  p2.register_post_accumulate_grad_hook([&](Tensor&) { order.push_back(2); });
  p3.register_post_accumulate_grad_hook([&](Tensor&) { order.push_back(3); });
  Tensor h = times(p1, p1);
  h = times(h, p2);
  h = times(h, p3);
  total(h).backward();
  EXPECT_EQ(order, (std::vector<int>{3, 2, 1}));
}

TEST(Engine, WrongGradientShapeNamesTheOp) {
  Tensor x = leaf({1, 2, 3});
  Tensor y = record("broken_op", kernels::mul_scalar(x, 2), {x}, [](const Grads&) -> Grads {
    return {zeros({2}, DType::f64)};
  });
  try {
    total(y).backward();
    FAIL();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("broken_op"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[2]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[3]"), std::string::npos) << msg;
  }
}

TEST(Engine, OnlyLeavesCanStopRequiringGrad) {
  Tensor x = leaf({1});
  Tensor y = times(x, x);
  EXPECT_THROW(y.requires_grad_(false), Error);
  EXPECT_FALSE(y.is_leaf());
  EXPECT_TRUE(x.is_leaf());
  EXPECT_FALSE(y.detach().requires_grad());
  EXPECT_THROW(zeros({2}, DType::i64).requires_grad_(), Error);
}

TEST(Engine, QueuedCallbacksRunOnceAfterEveryGradientIsAccumulated) {
  Tensor x = leaf({1, 2, 3});
  std::vector<std::string> events;
  std::vector<double> grad_seen_by_callback;
  Tensor y = record("spy", kernels::mul_scalar(x.detach(), 1), {x}, [&](const Grads& g) -> Grads {
    events.push_back("node");
    autograd::queue_callback([&] {
      events.push_back("callback");
      grad_seen_by_callback = x.grad().to_vector<double>();
      autograd::queue_callback([&] { events.push_back("queued by a callback"); });
    });
    return {g[0]};
  });
  EXPECT_FALSE(autograd::in_backward());
  total(times(y, y)).backward();
  EXPECT_EQ(events, (std::vector<std::string>{"node", "callback", "queued by a callback"}));
  EXPECT_EQ(grad_seen_by_callback, (std::vector<double>{2, 4, 6}));  // the leaf's grad is already there
}

TEST(Engine, CallbacksOutsideABackwardPassAreRefusedAndAFailedPassDropsThem) {
  EXPECT_TRUE(throws_with([] { autograd::queue_callback([] {}); }, {"queue_callback", "no backward pass"}));
  Tensor x = leaf({1, 2});
  bool ran = false;
  Tensor y = record("fails", kernels::mul_scalar(x.detach(), 1), {x}, [&](const Grads&) -> Grads {
    autograd::queue_callback([&] { ran = true; });
    OCTET_FAIL("this backward fails on purpose");
  });
  EXPECT_THROW(total(y).backward(), Error);
  EXPECT_FALSE(ran);
  EXPECT_FALSE(autograd::in_backward());
}

}  // namespace
}  // namespace octet
