// The op ledger (core/op_ledger.h) against counts worked out by hand for one small TransformerBlock,
// forward and backward in f32: which kernel entry points run, how often, and the bytes and FLOPs
// each one moves. Also the outermost-call rule: a kernel's own helpers are not counted again.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "autograd/ops.h"
#include "core/op_ledger.h"
#include "kernels/elementwise.h"
#include "kernels/linear.h"
#include "nn/layers.h"
#include "tests/testing.h"

namespace octet::nn {
namespace {

using octet::testing::random_tensor;

// B images of N tokens, width D, H heads of hd = D / H, MLP hidden width F.
constexpr int64_t B = 2, N = 5, D = 8, H = 2, F = 16;
constexpr int64_t kF32 = 4;  // bytes

struct Expected {
  int64_t calls, read, written;
  double flops;
};

// What each op of the block moves, with T = B·N tokens: a row of width w is w·4 bytes.
std::map<std::string, Expected> hand_counts() {
  constexpr int64_t T = B * N, hd = D / H;
  const int64_t act = T * D * kF32;                 // one [B, N, D] activation
  const int64_t stats = 2 * T * kF32;               // LayerNorm's mean and rstd
  const int64_t ln_params = 2 * D * kF32;           // LayerNorm's weight and bias
  const int64_t lse = B * H * N * kF32;             // attention's log-sum-exp
  const int64_t qkv = 3 * act, hidden = T * F * kF32;
  // A Linear in → out: forward reads x, W and b and writes y; backward reads dy, W and x and writes
  // dx, dW and db. FLOPs: 2 per multiply-add, one GEMM forward and two backward.
  const auto linear_fwd = [&](int64_t in, int64_t out) {
    return Expected{1, T * in * kF32 + out * in * kF32 + out * kF32, T * out * kF32, 2.0 * T * in * out};
  };
  const auto linear_bwd = [&](int64_t in, int64_t out) {
    return Expected{1, T * out * kF32 + out * in * kF32 + T * in * kF32, T * in * kF32 + out * in * kF32 + out * kF32,
                    4.0 * T * in * out};
  };
  // proj and fc2 also add the block's residuals to their outputs (no drop path here); on the CPU after
  // the product: the residual and y read, the sum written.
  const auto with_residual = [&](const Expected& e) { return Expected{1, e.read + 2 * act, e.written + act, e.flops}; };
  const Expected qkv_f = linear_fwd(D, 3 * D), proj_f = with_residual(linear_fwd(D, D)), fc1_f = linear_fwd(D, F),
                 fc2_f = with_residual(linear_fwd(F, D));
  const Expected qkv_b = linear_bwd(D, 3 * D), proj_b = linear_bwd(D, D);
  // fc1 -> act -> fc2 is autograd's linear_gelu_linear, which keeps only the GELU's input: its backward
  // runs fc2's dgrad (dy, W in; the GELU's output gradient out), makes the GELU's output again, then
  // the wgrad (dy, the GELU's output in; dW, db out): two calls, dy read by each. fc1's bias gradient
  // is summed beside the GELU's backward (on the CPU a sum of its own), so fc1's backward writes no db.
  const Expected fc1_b{1, linear_bwd(D, F).read, linear_bwd(D, F).written - F * kF32, linear_bwd(D, F).flops};
  const Expected fc2_dgrad{1, T * D * kF32 + D * F * kF32, T * F * kF32, 2.0 * T * F * D};
  const Expected fc2_wgrad{1, T * D * kF32 + T * F * kF32, D * F * kF32 + D * kF32, 2.0 * T * F * D};
  const auto sum = [](std::initializer_list<Expected> es) {
    Expected s{0, 0, 0, 0};
    for (const Expected& e : es) s = {s.calls + e.calls, s.read + e.read, s.written + e.written, s.flops + e.flops};
    return s;
  };
  const double attention_matmul = 2.0 * B * H * N * N * hd;  // one S×S×hd product per head
  return {
      // norm1 and norm2 (h made by proj's GEMM): x (h), weight, bias in; y, mean, rstd out.
      {"layernorm_forward", {2, 2 * (act + ln_params), 2 * (act + stats), 0}},
      {"linear_forward", sum({qkv_f, proj_f, fc1_f, fc2_f})},
      // q·kᵀ and P·v; reads qkv, writes the heads side by side and lse.
      {"packed_attention_forward", {1, qkv, act + lse, 2 * attention_matmul}},
      // Forward, and again in backward for fc2's weight gradient (gelu_linear).
      {"gelu_forward", {2, 2 * hidden, 2 * hidden, 0}},
      // No "add": the block's residual adds are proj's and fc2's (above), and the two gradients of x
      // and of h are summed in norm1's and norm2's backward passes (each LayerNorm's node passes its
      // input on).
      {"linear_backward", sum({qkv_b, proj_b, fc1_b, fc2_dgrad, fc2_wgrad})},
      {"gelu_backward", {1, 2 * hidden, hidden, 0}},
      // fc1's bias gradient: the GELU's input gradient in, db out.
      {"sum", {1, hidden, F * kF32, 0}},
      // norm2 and norm1: dy of the LayerNorm's output, the residual gradient (h's from fc2's add, x's
      // from proj's), h (x), weight, mean, rstd in; dh (dx), dweight, dbias out.
      {"add_layernorm_backward", {2, 2 * (3 * act + D * kF32 + stats), 2 * (act + ln_params), 0}},
      // dout, qkv, out, lse in; dqkv out. Five products: q·kᵀ again, dv, dP, dq, dk.
      {"packed_attention_backward", {1, act + qkv + act + lse, qkv, 5 * attention_matmul}},
  };
}

TEST(OpLedger, CountsOneTransformerBlockAsWorkedOutByHand) {
  TransformerBlock block(D, H, /*mlp_ratio=*/static_cast<double>(F) / D, /*qkv_bias=*/true);
  block.train();
  const Tensor x = random_tensor({B, N, D}, DType::f32, 1).requires_grad_();
  const Tensor upstream = random_tensor({B, N, D}, DType::f32, 2);
  OpLedger ledger;
  block(x).backward(upstream);
  const std::map<std::string, Expected> expected = hand_counts();
  for (const auto& [name, e] : expected) {
    const OpTally got = ledger.op(name);
    EXPECT_EQ(got.calls, e.calls) << name;
    EXPECT_EQ(got.bytes_read, e.read) << name;
    EXPECT_EQ(got.bytes_written, e.written) << name;
    EXPECT_DOUBLE_EQ(got.flops, e.flops) << name;
  }
  // Nothing else ran: no permutes, selects, zero-padded gradients, copies or casts.
  for (const auto& [name, t] : ledger.ops()) {
    EXPECT_TRUE(expected.count(name) == 1) << name << " ran " << t.calls << " time(s), moving " << t.bytes()
                                           << " bytes, and the hand count has no such op";
  }
  // 4 Linears forward and backward (fc2's backward in two calls), attention both ways.
  EXPECT_EQ(ledger.total(OpClass::kMatmul).calls, 11);
}

TEST(OpLedger, CountsOnlyTheOutermostEntryPoint) {
  // linear_forward runs a GEMM (and on the CPU a broadcast of the bias) inside: one call, its bytes.
  const Tensor x = random_tensor({6, 8}), w = random_tensor({4, 8}), b = random_tensor({4});
  const Tensor a16 = random_tensor({10}).to(DType::bf16), b16 = random_tensor({10}).to(DType::bf16);
  OpLedger ledger;
  kernels::linear_forward(x, w, b);
  ASSERT_EQ(ledger.ops().size(), 1u);
  EXPECT_EQ(ledger.op("linear_forward").calls, 1);
  EXPECT_EQ(ledger.op("linear_forward").bytes_read, (6 * 8 + 4 * 8 + 4) * kF32);
  EXPECT_EQ(ledger.op("linear_forward").bytes_written, 6 * 4 * kF32);
  EXPECT_EQ(ledger.op("gemm").calls, 0);
  // A bf16 add on the CPU widens both operands to f32 inside: counted as one add of bf16 bytes.
  kernels::add(a16, b16);
  EXPECT_EQ(ledger.op("add").bytes_read, 2 * 10 * 2);
  EXPECT_EQ(ledger.op("add").bytes_written, 10 * 2);
  EXPECT_EQ(ledger.op("cast").calls, 0);
  // Outside a kernel, a cast is an op of its own.
  (void)a16.to(DType::f32);
  EXPECT_EQ(ledger.op("cast").calls, 1);
  EXPECT_EQ(ledger.op("cast").bytes_written, 10 * kF32);
}

TEST(OpLedger, NestedLedgerTakesOverAndRecordsNothingWhenNoneIsAlive) {
  const Tensor a = random_tensor({3}), b = random_tensor({3});
  kernels::add(a, b);  // no ledger: nothing to check but that it runs
  OpLedger outer;
  kernels::add(a, b);
  {
    OpLedger inner;
    kernels::add(a, b);
    kernels::add(a, b);
    EXPECT_EQ(inner.op("add").calls, 2);
    EXPECT_EQ(OpLedger::current(), &inner);
  }
  EXPECT_EQ(OpLedger::current(), &outer);
  kernels::add(a, b);
  EXPECT_EQ(outer.op("add").calls, 2);
}

TEST(OpLedger, DifferenceAndSumPerOp) {
  OpTallies a, b;
  a["x"] = {OpClass::kMemory, 3, 30, 15, 0};
  a["y"] = {OpClass::kMatmul, 1, 10, 5, 100};
  b["x"] = {OpClass::kMemory, 1, 10, 5, 0};
  b["y"] = a["y"];
  const OpTallies d = ledger_difference(a, b);
  ASSERT_EQ(d.size(), 1u);  // y's difference is nothing: dropped
  EXPECT_EQ(d.at("x").calls, 2);
  EXPECT_EQ(d.at("x").bytes(), 30);
  const OpTallies s = ledger_plus(b, d, 3);
  EXPECT_EQ(s.at("x").calls, 7);
  EXPECT_EQ(s.at("x").bytes_read, 70);
  EXPECT_EQ(s.at("y").flops, 100);
  EXPECT_NE(ledger_table(s, 2.0).find("= memory ops"), std::string::npos);
}

}  // namespace
}  // namespace octet::nn
