// The FP8 GEMM's entry point and its CPU emulation (kernels/fp8_gemm.h).
#include "kernels/fp8_gemm.h"

#include <algorithm>

#include "core/float_formats.h"
#include "core/op_ledger.h"
#include "kernels/common.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cuda/fp8_gemm_cuda.h"
#include "kernels/gemm.h"

namespace octet::kernels {

namespace {

constexpr const char* kOp = "fp8_gemm";

// The rules of kernels/fp8_gemm.h, the same on every device.
void check_fp8_gemm(const Tensor& a, const Tensor& scale_inv_a, const Tensor& b, const Tensor& scale_inv_b,
                    const Tensor& out, const Tensor& bias) {
  check_defined(kOp, {&a, &scale_inv_a, &b, &scale_inv_b, &out});
  if (bias.defined()) {
    check_same_device(kOp, {&a, &scale_inv_a, &b, &scale_inv_b, &out, &bias});
  } else {
    check_same_device(kOp, {&a, &scale_inv_a, &b, &scale_inv_b, &out});
  }
  OCTET_CHECK(a.dim() == 2 && b.dim() == 2 && out.dim() == 2, kOp, ": a [m, k], b [n, k] and out [m, n] must be 2-d (",
              describe_all({&a, &b, &out}), "); flatten leading dims into m first");
  OCTET_CHECK(is_fp8(a.dtype()) && is_fp8(b.dtype()), kOp, ": a and b must be FP8 (e4m3 or e5m2), got ",
              describe_all({&a, &b}), "; cast them with kernels::fp8_cast");
  OCTET_CHECK(!(a.dtype() == DType::e5m2 && b.dtype() == DType::e5m2), kOp,
              ": a and b are both e5m2 (", describe_all({&a, &b}),
              "); Hopper has no E5M2×E5M2 FP8 GEMM: cast one of them (the forward-pass operand) to e4m3");
  const int64_t m = a.size(0), k = a.size(1), n = b.size(0);
  OCTET_CHECK(b.size(1) == k, kOp, ": a is [m, k] and b is [n, k], but their k differ (", describe_all({&a, &b}),
              "); b is stored K-major, i.e. transposed (TN layout)");
  OCTET_CHECK(k % 16 == 0 && n % 16 == 0, kOp, ": k = ", k, " and n = ", n, " must both be multiples of 16 (",
              describe_all({&a, &b}),
              "): Hopper's FP8 GEMM reads 16-byte aligned FP8 rows and writes 16-byte aligned output rows; pad the "
              "reduction dim with zero columns (fp8_cast pads its transposed copy), or run this GEMM in bf16");
  OCTET_CHECK(out.dtype() == DType::bf16 || out.dtype() == DType::f32, kOp, ": out must be bf16 or f32, got ",
              out.describe(), "; the FP8 GEMM does not write FP8 or f16 outputs");
  OCTET_CHECK(out.size(0) == m && out.size(1) == n, kOp, ": out ", out.describe(), " should be [", m, ", ", n, "] (",
              describe_all({&a, &b}), ")");
  if (bias.defined()) {
    OCTET_CHECK(bias.dim() == 1 && bias.size(0) == n && bias.dtype() == out.dtype(), kOp, ": bias ", bias.describe(),
                " should be [", n, "] in out's dtype ", dtype_name(out.dtype()), "; convert it with .to(dtype)");
  }
  for (const Tensor* s : {&scale_inv_a, &scale_inv_b}) {
    OCTET_CHECK(s->dim() == 1 && s->numel() == 1 && s->dtype() == DType::f32, kOp,
                ": scale_inv_a and scale_inv_b must be [1] f32 (", describe_all({&scale_inv_a, &scale_inv_b}),
                "); take them from Fp8Cast::scale_inv or a [1] view of a layer's FP8 state");
  }
}

// out[i, j] = Out(scale·sum[i, j] + bias[j] + old[i, j]), the bias and old terms only where given:
// the scales go on after the sum, as on the GPU, and the one rounding to out's dtype happens here
// (Out(float) is the same rounding as Tensor::copy_). old may be out itself.
template <class Out>
void scale_bias_round(const float* sum, float scale, const float* bias, const Out* old, Out* out, int64_t m,
                      int64_t n) {
  cpu::parallel_ranges(m, cpu::kParallelElements / std::max<int64_t>(n, 1), [&](int64_t row_begin, int64_t row_end) {
    for (int64_t i = row_begin; i < row_end; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        float v = scale * sum[i * n + j];
        if (bias) v += bias[j];
        if (old) v += static_cast<float>(old[i * n + j]);
        out[i * n + j] = static_cast<Out>(v);
      }
    }
  });
}

// out = round_to_out_dtype(scale_inv_a·scale_inv_b·(a·bᵀ) + bias + (accumulate ? out : 0)): a and b
// decode exactly to f32, one f32 GEMM sums the products, and one f32 pass applies the scales, the bias
// and the old out while rounding once into out. An f32 out that is not accumulated into holds the sum
// itself; otherwise the sum goes to a scratch buffer.
void fp8_gemm_cpu(const Tensor& a, const Tensor& scale_inv_a, const Tensor& b, const Tensor& scale_inv_b,
                  const Tensor& out, const Tensor& bias, bool accumulate, const Tensor& addend) {
  check_cpu(kOp, {&a, &scale_inv_a, &b, &scale_inv_b, &out});
  const int64_t m = out.size(0), n = out.size(1);
  const bool sum_in_out = out.dtype() == DType::f32 && !accumulate;
  // kernels::gemm widens FP8 operands to f32 exactly and writes every element (zeros when k = 0);
  // trans_b reads b [n, k] as bᵀ.
  Tensor sum = sum_in_out ? out : empty({m, n}, DType::f32);
  gemm(a, /*trans_a=*/false, b, /*trans_b=*/true, sum);
  const float scale = scale_inv_a.item<float>() * scale_inv_b.item<float>();
  const Tensor bias32 = bias.defined() ? bias.to(DType::f32) : Tensor();
  const float* bias_values = bias32.defined() ? bias32.data<float>() : nullptr;
  // What is added before the rounding: the old out (accumulate), the addend, or nothing.
  const void* old = accumulate ? out.data_ptr() : addend.defined() ? addend.data_ptr() : nullptr;
  if (out.dtype() == DType::f32) {
    float* o = out.data<float>();
    scale_bias_round(sum.data<float>(), scale, bias_values, static_cast<const float*>(old), o, m, n);
  } else {
    auto* o = static_cast<bfloat16*>(out.data_ptr());  // out is bf16 (check_fp8_gemm)
    scale_bias_round(sum.data<float>(), scale, bias_values, static_cast<const bfloat16*>(old), o, m, n);
  }
}

}  // namespace

void fp8_gemm(const Tensor& a, const Tensor& scale_inv_a, const Tensor& b, const Tensor& scale_inv_b, const Tensor& out,
              const Tensor& bias, bool accumulate, bool fast_accumulate, const Tensor& addend) {
  check_fp8_gemm(a, scale_inv_a, b, scale_inv_b, out, bias);
  if (addend.defined()) {
    check_same_device(kOp, {&out, &addend});
    OCTET_CHECK(!accumulate && addend.shape() == out.shape() && addend.dtype() == out.dtype(), kOp, ": the addend ",
                addend.describe(), " must have out's shape and dtype (", out.describe(),
                "), and goes without accumulate (which adds out itself)");
  }
  LedgerOp ledger("fp8_gemm", OpClass::kMatmul);
  // a [M, K] and b [N, K] give out [M, N].
  ledger.read({&a, &scale_inv_a, &b, &scale_inv_b, &bias}).write(out).flops(2.0 * static_cast<double>(a.size(0)) *
                                                                            static_cast<double>(b.size(0)) *
                                                                            static_cast<double>(a.size(1)));
  if (accumulate) ledger.read(out);
  ledger.read(addend);
  out.bump_version();
  if (a.is_cuda()) {
    return cuda::fp8_gemm(a, scale_inv_a, b, scale_inv_b, out, bias, accumulate, fast_accumulate, addend);
  }
  (void)fast_accumulate;  // the CPU sums in f32 throughout: there is nothing faster to switch to
  fp8_gemm_cpu(a, scale_inv_a, b, scale_inv_b, out, bias, accumulate, addend);
}

}  // namespace octet::kernels
