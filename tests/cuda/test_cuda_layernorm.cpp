// CUDA LayerNorm (plain and with the residual add fused in) against the CPU kernels on the same
// random inputs: norm-wise relative error, ||gpu - cpu||_2 / ||cpu||_2 in f64, at most 1e-5 for f32
// and 1e-2 for bf16, with the fused LayerNorm's tighter bounds derived where it is tested; the warp-
// per-row kernels around their register capacity, and the register backward at uneven row splits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/elementwise.h"
#include "kernels/nn_ops.h"
#include "tests/testing.h"
#include "tests/cuda/cuda_testing.h"

namespace octet {
namespace {

using testing::kGpu;
using testing::max_row_relative_error;
using testing::misaligned_on_gpu;
using testing::random_tensor;
using testing::relative_error_matching_nans;
using testing::same_bits;
using testing::tolerance;

using testing::kRows;
using testing::kWidths;

// ---- LayerNorm ----------------------------------------------------------------------------------------

struct AffineCase {
  bool affine;
  DType weight_dtype;
};

TEST(CudaLayerNorm, ForwardAndBackwardMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  for (DType d : {DType::f32, DType::bf16}) {
    for (AffineCase a : {AffineCase{true, DType::f32}, AffineCase{true, d}, AffineCase{false, d}}) {
      for (int64_t rows : kRows) {
        for (int64_t C : kWidths) {
          SCOPED_TRACE(::testing::Message() << dtype_name(d) << " rows " << rows << " C " << C << " weight "
                                            << (a.affine ? dtype_name(a.weight_dtype) : "none"));
          const Tensor x = random_tensor({rows, C}, d, 10 + rows + C, 2.0);
          const Tensor dy = random_tensor({rows, C}, d, 20 + rows + C);
          const Tensor w = a.affine ? random_tensor({C}, a.weight_dtype, 30 + C) : Tensor();
          const Tensor b = a.affine ? random_tensor({C}, a.weight_dtype, 40 + C) : Tensor();
          const auto cpu = kernels::layernorm_forward(x, w, b, 1e-5);
          const auto gpu = kernels::layernorm_forward(x.to(kGpu), a.affine ? w.to(kGpu) : w,
                                                      a.affine ? b.to(kGpu) : b, 1e-5);
          EXPECT_LE(relative_error_matching_nans(gpu.y, cpu.y), tolerance(d));
          EXPECT_LE(relative_error_matching_nans(gpu.mean, cpu.mean), 1e-5);
          EXPECT_LE(relative_error_matching_nans(gpu.rstd, cpu.rstd), 1e-5);

          const auto cpu_grads = kernels::layernorm_backward(dy, x, w, cpu.mean, cpu.rstd);
          const auto gpu_grads = kernels::layernorm_backward(dy.to(kGpu), x.to(kGpu), a.affine ? w.to(kGpu) : w,
                                                             gpu.mean, gpu.rstd);
          EXPECT_LE(relative_error_matching_nans(gpu_grads.dx, cpu_grads.dx), tolerance(d));
          if (a.affine) {
            EXPECT_LE(relative_error_matching_nans(gpu_grads.dweight, cpu_grads.dweight), tolerance(a.weight_dtype));
            EXPECT_LE(relative_error_matching_nans(gpu_grads.dbias, cpu_grads.dbias), tolerance(a.weight_dtype));
          } else {
            EXPECT_FALSE(gpu_grads.dweight.defined());
          }
        }
      }
    }
  }
}

TEST(CudaLayerNorm, ManyRowsLeadingDimsAndUnalignedRowsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  // 64·197 rows of ViT-H's width: many rows per backward block; then a misaligned copy (scalar path).
  for (Shape shape : {Shape{64, 197, 1280}, Shape{3, 5, 96}}) {
    const Tensor x = random_tensor(shape, DType::bf16, 50, 3.0), dy = random_tensor(shape, DType::bf16, 51);
    const int64_t C = shape[shape.ndim() - 1];
    const Tensor w = random_tensor({C}, DType::f32, 52), b = random_tensor({C}, DType::f32, 53);
    const auto cpu = kernels::layernorm_forward(x, w, b);
    const auto cpu_grads = kernels::layernorm_backward(dy, x, w, cpu.mean, cpu.rstd);
    for (bool misaligned : {false, true}) {
      SCOPED_TRACE(::testing::Message() << shape << (misaligned ? " misaligned" : ""));
      const Tensor xg = misaligned ? misaligned_on_gpu(x) : x.to(kGpu);
      const Tensor dyg = misaligned ? misaligned_on_gpu(dy) : dy.to(kGpu);
      const auto gpu = kernels::layernorm_forward(xg, w.to(kGpu), b.to(kGpu));
      EXPECT_LE(relative_error_matching_nans(gpu.y, cpu.y), 1e-2);
      EXPECT_LE(max_row_relative_error(gpu.y, cpu.y, C), 1e-2) << "a row of y";
      EXPECT_LE(relative_error_matching_nans(gpu.rstd, cpu.rstd), 1e-5);
      const auto gpu_grads = kernels::layernorm_backward(dyg, xg, w.to(kGpu), gpu.mean, gpu.rstd);
      EXPECT_LE(relative_error_matching_nans(gpu_grads.dx, cpu_grads.dx), 1e-2);
      EXPECT_LE(max_row_relative_error(gpu_grads.dx, cpu_grads.dx, C), 1e-2) << "a row of dx";
      EXPECT_LE(relative_error_matching_nans(gpu_grads.dweight, cpu_grads.dweight), 1e-5);
      EXPECT_LE(relative_error_matching_nans(gpu_grads.dbias, cpu_grads.dbias), 1e-5);
    }
  }
}

TEST(CudaLayerNorm, WeightGradientsRepeatBitForBit) {
  SKIP_WITHOUT_GPU();
  const Tensor x = random_tensor({1000, 768}, DType::f32, 60).to(kGpu);
  const Tensor dy = random_tensor({1000, 768}, DType::f32, 61).to(kGpu);
  const Tensor w = random_tensor({768}, DType::f32, 62).to(kGpu), b = random_tensor({768}, DType::f32, 63).to(kGpu);
  const auto fwd = kernels::layernorm_forward(x, w, b);
  const auto first = kernels::layernorm_backward(dy, x, w, fwd.mean, fwd.rstd);
  const auto second = kernels::layernorm_backward(dy, x, w, fwd.mean, fwd.rstd);
  EXPECT_TRUE(same_bits(second.dweight, first.dweight.to(Device::cpu())));
  EXPECT_TRUE(same_bits(second.dbias, first.dbias.to(Device::cpu())));
}

// ---- residual add fused into LayerNorm --------------------------------------------------------------------
//
// The bounds, derived. h is computed on both devices by one f32 add (IEEE, round to nearest) of the
// same inputs and one round to nearest even into the dtype: the same bits. Everything else is the
// LayerNorm kernels' f32 arithmetic on those same h bits, in another summation order; those f32
// values agree within the suite's f32 bound, tolerance(f32) = 1e-5, as CudaLayerNorm above shows for
// the unfused kernels. Rounding two f32 values a, b to nearest in a format whose ulp is at most
// 2^-(p-1) of the value (p significant bits) gives |round(a) - round(b)| <= |a - b| + ulp, so a
// result rounded once to bf16 (p = 8) is within 1e-5 + 2^-7 norm-wise, to f16 (p = 11) within
// 1e-5 + 2^-10; an f32 result within 1e-5.
// The backward's dh is dx + dh_residual, with dh_residual the same bits on both devices: only dx
// differs, so dh's f32 error is 1e-5 · ||dx|| / ||dh|| (plus 2^-24 from the add's own rounding),
// then the rounding to the dtype on top.

double rounding_bound(DType d) { return d == DType::bf16 ? 0x1p-7 : d == DType::f16 ? 0x1p-10 : 0.0; }

double norm(const Tensor& t) {
  double sq = 0;
  for (double v : t.to(Device::cpu()).to_vector<double>()) sq += v * v;
  return std::sqrt(sq);
}

TEST(CudaAddLayerNorm, MatchesTheCpuWithinTheDerivedBounds) {
  SKIP_WITHOUT_GPU();
  const double f32_bound = tolerance(DType::f32);
  for (DType d : {DType::f32, DType::bf16}) {
    for (AffineCase a : {AffineCase{true, DType::f32}, AffineCase{true, d}, AffineCase{false, d}}) {
      for (int64_t rows : kRows) {
        for (int64_t C : kWidths) {
          for (bool misaligned : {false, true}) {
            SCOPED_TRACE(::testing::Message() << dtype_name(d) << " rows " << rows << " C " << C << " weight "
                                              << (a.affine ? dtype_name(a.weight_dtype) : "none")
                                              << (misaligned ? " misaligned" : ""));
            const Tensor x = random_tensor({rows, C}, d, 110 + rows + C, 2.0);
            const Tensor y = random_tensor({rows, C}, d, 120 + rows + C);
            const Tensor dy = random_tensor({rows, C}, d, 130 + rows + C);
            const Tensor dres = random_tensor({rows, C}, d, 140 + rows + C);
            const Tensor w = a.affine ? random_tensor({C}, a.weight_dtype, 150 + C) : Tensor();
            const Tensor b = a.affine ? random_tensor({C}, a.weight_dtype, 160 + C) : Tensor();
            const Tensor wg = a.affine ? w.to(kGpu) : w, bg = a.affine ? b.to(kGpu) : b;
            // A misaligned x sends the kernels down their scalar paths.
            const Tensor xg = misaligned ? misaligned_on_gpu(x) : x.to(kGpu);

            const auto cpu = kernels::add_layernorm_forward(x, y, w, b, 1e-5);
            const auto gpu = kernels::add_layernorm_forward(xg, y.to(kGpu), wg, bg, 1e-5);
            EXPECT_TRUE(same_bits(gpu.h, cpu.h));
            EXPECT_LE(relative_error_matching_nans(gpu.y, cpu.y), f32_bound + rounding_bound(d));
            EXPECT_LE(relative_error_matching_nans(gpu.mean, cpu.mean), f32_bound);
            EXPECT_LE(relative_error_matching_nans(gpu.rstd, cpu.rstd), f32_bound);

            const Tensor dx = kernels::layernorm_backward(dy, cpu.h, w, cpu.mean, cpu.rstd).dx;
            const double dh_bound =
                f32_bound * norm(dx) / norm(kernels::add(dx, dres)) + 0x1p-24 + rounding_bound(d);
            const Tensor dyg = misaligned ? misaligned_on_gpu(dy) : dy.to(kGpu);
            for (bool residual : {true, false}) {
              SCOPED_TRACE(residual ? "with dh_residual" : "without dh_residual");
              const Tensor r = residual ? dres : Tensor(), rg = residual ? dres.to(kGpu) : Tensor();
              const auto cg = kernels::add_layernorm_backward(dy, r, cpu.h, w, cpu.mean, cpu.rstd);
              const auto gg = kernels::add_layernorm_backward(dyg, rg, gpu.h, wg, gpu.mean, gpu.rstd);
              EXPECT_LE(relative_error_matching_nans(gg.dh, cg.dh),
                        residual ? dh_bound : f32_bound + rounding_bound(d));
              if (a.affine) {
                const double wb = f32_bound + rounding_bound(a.weight_dtype);
                EXPECT_LE(relative_error_matching_nans(gg.dweight, cg.dweight), wb);
                EXPECT_LE(relative_error_matching_nans(gg.dbias, cg.dbias), wb);
              } else {
                EXPECT_FALSE(gg.dweight.defined() || gg.dbias.defined());
              }
            }
          }
        }
      }
    }
  }
}

// add_layernorm_forward / _backward against add() then layernorm_forward() and layernorm_backward()
// on the GPU, bit for bit where the two compute the same (the reasons are at each caller): the
// forward's h, y, mean and rstd; the backward's dweight and dbias, and in f32 dh; and without a
// residual gradient, dh equal to LayerNorm's dx. All tensors on the GPU.
void expect_fused_add_equals_unfused(const Tensor& x, const Tensor& y, const Tensor& dy, const Tensor& dres,
                                     const Tensor& w, const Tensor& b) {
  const auto fused = kernels::add_layernorm_forward(x, y, w, b);
  const Tensor h = kernels::add(x, y);
  const auto unfused = kernels::layernorm_forward(h, w, b);
  EXPECT_TRUE(same_bits(fused.h, h));
  EXPECT_TRUE(same_bits(fused.y, unfused.y));
  EXPECT_TRUE(same_bits(fused.mean, unfused.mean));
  EXPECT_TRUE(same_bits(fused.rstd, unfused.rstd));

  const auto fused_grads = kernels::add_layernorm_backward(dy, dres, fused.h, w, fused.mean, fused.rstd);
  const auto ln = kernels::layernorm_backward(dy, h, w, unfused.mean, unfused.rstd);
  if (x.dtype() == DType::f32) {
    EXPECT_TRUE(same_bits(fused_grads.dh, kernels::add(ln.dx, dres)));
  }
  EXPECT_TRUE(same_bits(fused_grads.dweight, ln.dweight));
  EXPECT_TRUE(same_bits(fused_grads.dbias, ln.dbias));
  const auto no_residual = kernels::add_layernorm_backward(dy, Tensor(), fused.h, w, fused.mean, fused.rstd);
  EXPECT_TRUE(same_bits(no_residual.dh, ln.dx));
}

// On aligned rows the fused kernels take the same vectorized paths as add and the LayerNorm
// kernels, with the same f32 arithmetic in the same order: the forward equals add then
// layernorm_forward on the GPU bit for bit (bf16 too, since h is rounded before it is normalized),
// and in f32 the backward equals layernorm_backward then add (the residual is added with __fadd_rn,
// never merged into an FMA). In bf16 the fused backward rounds once where the unfused rounds twice,
// so only its dweight and dbias (which the residual does not touch) are compared bitwise.
TEST(CudaAddLayerNorm, EqualsTheUnfusedGpuKernelsBitForBit) {
  SKIP_WITHOUT_GPU();
  for (DType d : {DType::f32, DType::bf16}) {
    for (int64_t C : kWidths) {
      SCOPED_TRACE(::testing::Message() << dtype_name(d) << " C " << C);
      const Tensor x = random_tensor({37, C}, d, 170 + C, 2.0).to(kGpu);
      const Tensor y = random_tensor({37, C}, d, 171 + C).to(kGpu);
      const Tensor dy = random_tensor({37, C}, d, 172 + C).to(kGpu);
      const Tensor dres = random_tensor({37, C}, d, 173 + C).to(kGpu);
      const Tensor w = random_tensor({C}, DType::f32, 174 + C).to(kGpu);
      const Tensor b = random_tensor({C}, DType::f32, 175 + C).to(kGpu);

      expect_fused_add_equals_unfused(x, y, dy, dres, w, b);
    }
  }
}

TEST(CudaAddLayerNorm, ViTShapedInputsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  // A ViT-B batch: [B, N, D] with many rows per backward block, bf16 activations, f32 parameters.
  const Shape shape{16, 197, 768};
  const Tensor x = random_tensor(shape, DType::bf16, 180, 3.0), y = random_tensor(shape, DType::bf16, 181);
  const Tensor dy = random_tensor(shape, DType::bf16, 182), dres = random_tensor(shape, DType::bf16, 183);
  const Tensor w = random_tensor({768}, DType::f32, 184), b = random_tensor({768}, DType::f32, 185);
  const auto cpu = kernels::add_layernorm_forward(x, y, w, b);
  const auto gpu = kernels::add_layernorm_forward(x.to(kGpu), y.to(kGpu), w.to(kGpu), b.to(kGpu));
  EXPECT_TRUE(same_bits(gpu.h, cpu.h));
  EXPECT_LE(relative_error_matching_nans(gpu.y, cpu.y), tolerance(DType::f32) + rounding_bound(DType::bf16));
  const auto cg = kernels::add_layernorm_backward(dy, dres, cpu.h, w, cpu.mean, cpu.rstd);
  const auto gg =
      kernels::add_layernorm_backward(dy.to(kGpu), dres.to(kGpu), gpu.h, w.to(kGpu), gpu.mean, gpu.rstd);
  const Tensor dx = kernels::layernorm_backward(dy, cpu.h, w, cpu.mean, cpu.rstd).dx;
  const double dh_bound = tolerance(DType::f32) * norm(dx) / norm(cg.dh) + 0x1p-24 + rounding_bound(DType::bf16);
  EXPECT_LE(relative_error_matching_nans(gg.dh, cg.dh), dh_bound);
  EXPECT_LE(relative_error_matching_nans(gg.dweight, cg.dweight), tolerance(DType::f32));
  EXPECT_LE(relative_error_matching_nans(gg.dbias, cg.dbias), tolerance(DType::f32));
}

// ---- the warp-per-row kernels: where their layout changes ---------------------------------------------
//
// The forward holds a row in registers while it fits 8 units of 16 bytes per lane (2048 bf16/f16 or
// 1024 f32 elements), the backward while it fits 6 (1536 and 768); longer rows take the block-per-row
// kernels. The widths: one element; units not filled (C not a multiple of 8, or of 4 for f32); lanes
// holding different numbers of units (255, 257); each capacity and one past it; ViT-H's 1280; and
// 16384 (a block per row, the backward's partial sums in global memory). The rows: 1, and 5 (a
// forward block of 4 rows and one more; a backward block of 8 warps not full).
const std::vector<int64_t> kRowKernelWidths = {1,    5,    8,    9,    255,  256,  257,  768,  769,
                                               1024, 1025, 1280, 1536, 1537, 2048, 2049, 16384};

constexpr int64_t kForwardRowUnits = 8, kBackwardRowUnits = 6;  // kernels/cuda/layernorm*.{cu,cuh}
int64_t row_capacity(DType d, int64_t units) { return 32 * units * (16 / static_cast<int64_t>(dtype_size(d))); }

// Which copies of the inputs the GPU reads: all 16-byte aligned (packed loads), the activations one
// element past that (element loads in the same layout), or the weight and bias one element past it.
enum class Placement { Aligned, MisalignedRows, MisalignedParams };
const char* placement_name(Placement p) {
  return p == Placement::Aligned ? "aligned" : p == Placement::MisalignedRows ? "misaligned rows" : "misaligned params";
}
Tensor on_gpu(const Tensor& t, bool misaligned) {
  if (!t.defined()) return t;
  return misaligned ? misaligned_on_gpu(t) : t.to(kGpu);
}

// scale · N(0, 1) + offset, drawn in f64 and rounded to d.
Tensor offset_random(const Shape& shape, DType d, uint64_t seed, double scale, double offset) {
  Tensor t = random_tensor(shape, DType::f64, seed, scale);
  double* p = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] += offset;
  return t.to(d);
}

Tensor zeros(DType d, int64_t rows) { return full({rows, 1}, 0.0, d); }

// Every output of the four LayerNorm entry points against the CPU's, with the bounds derived above:
// f32 arithmetic within 1e-5, then one rounding to the output's dtype. LayerNorm takes weights in f32
// or in x's dtype (check_layernorm_weight_dtype): bf16 x gets f32 weights (a bf16 model's LayerNorms)
// and f16 x f16 weights, so that both kinds of 16-bit weight loads run; f32 x gets f32. x sits around 3,
// so that the means' relative errors are not those of sums that happen to cancel (one row of 1024
// f32 draws can have a mean 100 times smaller than its spread).
TEST(CudaLayerNormRowKernels, WidthsAroundTheRegisterCapacityMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  const double f32_bound = tolerance(DType::f32);
  for (DType d : {DType::f32, DType::bf16, DType::f16}) {
    const DType wd = d == DType::f16 ? DType::f16 : DType::f32;
    for (int64_t C : kRowKernelWidths) {
      for (int64_t rows : {int64_t{1}, int64_t{5}}) {
        const uint64_t seed = 1000 + 7 * static_cast<uint64_t>(C) + static_cast<uint64_t>(rows);
        const Tensor x = offset_random({rows, C}, d, seed, 2.0, 3.0), y = random_tensor({rows, C}, d, seed + 1);
        const Tensor dy = random_tensor({rows, C}, d, seed + 2), dres = random_tensor({rows, C}, d, seed + 3);
        const Tensor w = random_tensor({C}, wd, seed + 4), b = random_tensor({C}, wd, seed + 5);
        const auto cpu = kernels::layernorm_forward(x, w, b, 1e-5);
        const auto cpu_grads = kernels::layernorm_backward(dy, x, w, cpu.mean, cpu.rstd);
        const auto cpu_add = kernels::add_layernorm_forward(x, y, w, b, 1e-5);
        const auto cpu_add_grads = kernels::add_layernorm_backward(dy, dres, cpu_add.h, w, cpu_add.mean, cpu_add.rstd);
        const Tensor dx_of_h = kernels::layernorm_backward(dy, cpu_add.h, w, cpu_add.mean, cpu_add.rstd).dx;
        const double dh_bound = f32_bound * norm(dx_of_h) / norm(cpu_add_grads.dh) + 0x1p-24 + rounding_bound(d);
        const double out_bound = f32_bound + rounding_bound(d), param_bound = f32_bound + rounding_bound(wd);
        for (Placement p : {Placement::Aligned, Placement::MisalignedRows, Placement::MisalignedParams}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(d) << " rows " << rows << " C " << C << " weight "
                                            << dtype_name(wd) << ", " << placement_name(p));
          const bool mr = p == Placement::MisalignedRows, mp = p == Placement::MisalignedParams;
          const Tensor xg = on_gpu(x, mr), yg = on_gpu(y, mr), dyg = on_gpu(dy, mr), dresg = on_gpu(dres, mr);
          const Tensor wg = on_gpu(w, mp), bg = on_gpu(b, mp);

          const auto gpu = kernels::layernorm_forward(xg, wg, bg, 1e-5);
          EXPECT_LE(relative_error_matching_nans(gpu.y, cpu.y), out_bound);
          EXPECT_LE(relative_error_matching_nans(gpu.mean, cpu.mean), f32_bound);
          EXPECT_LE(relative_error_matching_nans(gpu.rstd, cpu.rstd), f32_bound);
          const auto grads = kernels::layernorm_backward(dyg, xg, wg, gpu.mean, gpu.rstd);
          if (C == 1) {
            // x - mean and g - mean(g) are exactly 0, and so is dx; the CPU's (contracted) arithmetic
            // leaves rounding noise there, which is no reference for a relative error.
            EXPECT_TRUE(same_bits(grads.dx, zeros(d, rows)));
          } else {
            EXPECT_LE(relative_error_matching_nans(grads.dx, cpu_grads.dx), out_bound);
          }
          EXPECT_LE(relative_error_matching_nans(grads.dweight, cpu_grads.dweight), param_bound);
          EXPECT_LE(relative_error_matching_nans(grads.dbias, cpu_grads.dbias), param_bound);

          const auto add = kernels::add_layernorm_forward(xg, yg, wg, bg, 1e-5);
          EXPECT_TRUE(same_bits(add.h, cpu_add.h));
          EXPECT_LE(relative_error_matching_nans(add.y, cpu_add.y), out_bound);
          EXPECT_LE(relative_error_matching_nans(add.mean, cpu_add.mean), f32_bound);
          EXPECT_LE(relative_error_matching_nans(add.rstd, cpu_add.rstd), f32_bound);
          const auto add_grads = kernels::add_layernorm_backward(dyg, dresg, add.h, wg, add.mean, add.rstd);
          if (C == 1) {
            EXPECT_TRUE(same_bits(add_grads.dh, dres));  // 0 + dh_residual
          } else {
            EXPECT_LE(relative_error_matching_nans(add_grads.dh, cpu_add_grads.dh), dh_bound);
          }
          EXPECT_LE(relative_error_matching_nans(add_grads.dweight, cpu_add_grads.dweight), param_bound);
          EXPECT_LE(relative_error_matching_nans(add_grads.dbias, cpu_add_grads.dbias), param_bound);
        }
        // Without affine parameters.
        SCOPED_TRACE(::testing::Message() << dtype_name(d) << " rows " << rows << " C " << C << ", no weight");
        const auto plain = kernels::layernorm_forward(x, Tensor(), Tensor(), 1e-5);
        const auto gpu = kernels::layernorm_forward(x.to(kGpu), Tensor(), Tensor(), 1e-5);
        EXPECT_LE(relative_error_matching_nans(gpu.y, plain.y), out_bound);
        const auto plain_grads = kernels::layernorm_backward(dy, x, Tensor(), plain.mean, plain.rstd);
        const auto grads = kernels::layernorm_backward(dy.to(kGpu), x.to(kGpu), Tensor(), gpu.mean, gpu.rstd);
        if (C == 1) {
          EXPECT_TRUE(same_bits(grads.dx, zeros(d, rows)));
        } else {
          EXPECT_LE(relative_error_matching_nans(grads.dx, plain_grads.dx), out_bound);
        }
        EXPECT_FALSE(grads.dweight.defined() || grads.dbias.defined());
      }
    }
  }
}

// ---- the register backward at the row counts that split it unevenly -----------------------------------

// The register backward against the CPU, with and without the residual gradient, at row counts that
// leave a block's last warps part of their rows or none (5, 1056, 2149, 3200) and ViT-H's 12,608 rows
// (6 a warp); widths at the register capacity, below it, and not a multiple of a unit; aligned and
// misaligned rows. dx, dweight and dbias within the CPU bounds of the test above, and repeating bit
// for bit; the residual path with no residual gradient gives LayerNorm's dx. (This test once also held a
// second design of the kernel to this one's dx bits; the design lost on an H200 and was removed.)
TEST(CudaLayerNormBackwardRows, UnevenRowSplitsMatchTheCpuAndRepeat) {
  SKIP_WITHOUT_GPU();
  const double f32_bound = tolerance(DType::f32);
  for (DType d : {DType::bf16, DType::f32}) {
    const int64_t capacity = row_capacity(d, kBackwardRowUnits);
    for (int64_t C : {capacity, capacity * 5 / 6, int64_t{100}}) {
      for (int64_t rows : {int64_t{5}, int64_t{1056}, int64_t{2149}, int64_t{3200}, int64_t{12608}}) {
        for (bool misaligned : {false, true}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(d) << " rows " << rows << " C " << C
                                            << (misaligned ? ", misaligned rows" : ""));
          const uint64_t seed = 3000 + 11 * static_cast<uint64_t>(C) + static_cast<uint64_t>(rows);
          const Tensor x = offset_random({rows, C}, d, seed, 2.0, 3.0), y = random_tensor({rows, C}, d, seed + 1);
          const Tensor dy = random_tensor({rows, C}, d, seed + 2), dres = random_tensor({rows, C}, d, seed + 3);
          const Tensor w = random_tensor({C}, d, seed + 4), b = random_tensor({C}, d, seed + 5);
          const auto cpu = kernels::add_layernorm_forward(x, y, w, b, 1e-5);
          const auto cpu_ln = kernels::layernorm_backward(dy, cpu.h, w, cpu.mean, cpu.rstd);
          const auto cpu_add = kernels::add_layernorm_backward(dy, dres, cpu.h, w, cpu.mean, cpu.rstd);
          const double param_bound = f32_bound + rounding_bound(d);

          const Tensor dyg = on_gpu(dy, misaligned), dresg = on_gpu(dres, misaligned), wg = w.to(kGpu);
          const auto fwd = kernels::add_layernorm_forward(on_gpu(x, misaligned), on_gpu(y, misaligned), wg,
                                                          b.to(kGpu), 1e-5);
          const Tensor hg = on_gpu(fwd.h.to(Device::cpu()), misaligned);
          auto run = [&] {
            return std::make_pair(kernels::layernorm_backward(dyg, hg, wg, fwd.mean, fwd.rstd),
                                  kernels::add_layernorm_backward(dyg, dresg, hg, wg, fwd.mean, fwd.rstd));
          };
          const auto [ln, add] = run();
          // dx: the f32 arithmetic's bound plus its one rounding to d, as in the test above.
          EXPECT_LE(relative_error_matching_nans(ln.dx, cpu_ln.dx), param_bound);
          EXPECT_LE(relative_error_matching_nans(ln.dweight, cpu_ln.dweight), param_bound);
          EXPECT_LE(relative_error_matching_nans(ln.dbias, cpu_ln.dbias), param_bound);
          EXPECT_LE(relative_error_matching_nans(add.dweight, cpu_add.dweight), param_bound);
          EXPECT_LE(relative_error_matching_nans(add.dbias, cpu_add.dbias), param_bound);
          // A rerun repeats, and the residual path adds nothing when there is no residual gradient.
          const auto again = run();
          EXPECT_TRUE(same_bits(again.first.dx, ln.dx));
          EXPECT_TRUE(same_bits(again.first.dweight, ln.dweight));
          EXPECT_TRUE(same_bits(again.second.dh, add.dh));
          EXPECT_TRUE(same_bits(again.second.dbias, add.dbias));
          EXPECT_TRUE(same_bits(kernels::add_layernorm_backward(dyg, Tensor(), hg, wg, fwd.mean, fwd.rstd).dh,
                                ln.dx));
        }
      }
    }
  }
  // Without affine parameters.
  const Tensor x = offset_random({2149, 1280}, DType::bf16, 77, 2.0, 3.0);
  const Tensor dy = random_tensor({2149, 1280}, DType::bf16, 78);
  const auto cpu = kernels::layernorm_forward(x, Tensor(), Tensor(), 1e-5);
  const auto cpu_grads = kernels::layernorm_backward(dy, x, Tensor(), cpu.mean, cpu.rstd);
  const auto gpu = kernels::layernorm_forward(x.to(kGpu), Tensor(), Tensor(), 1e-5);
  const auto grads = kernels::layernorm_backward(dy.to(kGpu), x.to(kGpu), Tensor(), gpu.mean, gpu.rstd);
  EXPECT_LE(relative_error_matching_nans(grads.dx, cpu_grads.dx), f32_bound + rounding_bound(DType::bf16));
  EXPECT_FALSE(grads.dweight.defined() || grads.dbias.defined());
}

// On the register path each lane adds the same elements in the same order however its row was loaded
// (16-byte packs or one element at a time) and however the weights were: an aligned and a misaligned
// copy of the same inputs give the same bits, forward and backward. And, on every path, the residual
// add fused in gives add() then layernorm_forward()'s bits (f16 and bf16 too, since h is rounded before
// it is normalized); in f32 the backward gives layernorm_backward() then add()'s.
TEST(CudaLayerNormRowKernels, BitsDependOnTheValuesOnly) {
  SKIP_WITHOUT_GPU();
  for (DType d : {DType::f32, DType::bf16, DType::f16}) {
    for (int64_t C : {1, 9, 100, 257, 768, 1024, 1280, 2048, 2049}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(d) << " C " << C);
      const int64_t rows = 13;
      const Tensor x = random_tensor({rows, C}, d, 2000 + C, 2.0), y = random_tensor({rows, C}, d, 2100 + C);
      const Tensor dy = random_tensor({rows, C}, d, 2200 + C), dres = random_tensor({rows, C}, d, 2300 + C);
      const Tensor w = random_tensor({C}, DType::f32, 2400 + C), b = random_tensor({C}, DType::f32, 2500 + C);
      const Tensor xa = x.to(kGpu), dya = dy.to(kGpu), wa = w.to(kGpu), ba = b.to(kGpu);
      const Tensor xm = misaligned_on_gpu(x), dym = misaligned_on_gpu(dy);
      const Tensor wm = misaligned_on_gpu(w), bm = misaligned_on_gpu(b);

      const auto fa = kernels::layernorm_forward(xa, wa, ba);
      const auto ba_grads = kernels::layernorm_backward(dya, xa, wa, fa.mean, fa.rstd);
      if (C <= row_capacity(d, kForwardRowUnits)) {
        for (const auto& other : {kernels::layernorm_forward(xm, wa, ba), kernels::layernorm_forward(xa, wm, bm)}) {
          EXPECT_TRUE(same_bits(other.y, fa.y));
          EXPECT_TRUE(same_bits(other.mean, fa.mean));
          EXPECT_TRUE(same_bits(other.rstd, fa.rstd));
        }
      }
      if (C <= row_capacity(d, kBackwardRowUnits)) {
        for (const auto& other : {kernels::layernorm_backward(dym, xm, wa, fa.mean, fa.rstd),
                                  kernels::layernorm_backward(dya, xa, wm, fa.mean, fa.rstd)}) {
          EXPECT_TRUE(same_bits(other.dx, ba_grads.dx));
          EXPECT_TRUE(same_bits(other.dweight, ba_grads.dweight));
          EXPECT_TRUE(same_bits(other.dbias, ba_grads.dbias));
        }
      }

      const Tensor ya = y.to(kGpu), dresa = dres.to(kGpu);
      expect_fused_add_equals_unfused(xa, ya, dya, dresa, wa, ba);
    }
  }
}

// Past 8 · 264 = 2112 rows each backward warp takes more than one row (4097: two, and the last block
// a single row), adding them into its slots before the block's partial is written; the weight
// gradients repeat bit for bit.
TEST(CudaLayerNormRowKernels, ManyRowsPerWarpMatchTheCpuAndRepeat) {
  SKIP_WITHOUT_GPU();
  const double f32_bound = tolerance(DType::f32);
  for (DType d : {DType::bf16, DType::f32}) {
    const int64_t rows = 4097, C = d == DType::bf16 ? 1280 : 768;
    SCOPED_TRACE(::testing::Message() << dtype_name(d) << " " << rows << "x" << C);
    const Tensor x = random_tensor({rows, C}, d, 2600, 3.0), dy = random_tensor({rows, C}, d, 2601);
    const Tensor dres = random_tensor({rows, C}, d, 2602);
    const Tensor w = random_tensor({C}, d, 2603), b = random_tensor({C}, d, 2604);
    const auto cpu = kernels::layernorm_forward(x, w, b);
    const auto cpu_grads = kernels::add_layernorm_backward(dy, dres, x, w, cpu.mean, cpu.rstd);
    const Tensor xg = x.to(kGpu), dyg = dy.to(kGpu), dresg = dres.to(kGpu), wg = w.to(kGpu), bg = b.to(kGpu);
    const auto gpu = kernels::layernorm_forward(xg, wg, bg);
    EXPECT_LE(relative_error_matching_nans(gpu.y, cpu.y), f32_bound + rounding_bound(d));
    EXPECT_LE(relative_error_matching_nans(gpu.mean, cpu.mean), f32_bound);
    EXPECT_LE(relative_error_matching_nans(gpu.rstd, cpu.rstd), f32_bound);
    const auto first = kernels::add_layernorm_backward(dyg, dresg, xg, wg, gpu.mean, gpu.rstd);
    const Tensor dx = kernels::layernorm_backward(dy, x, w, cpu.mean, cpu.rstd).dx;
    const double dh_bound = f32_bound * norm(dx) / norm(cpu_grads.dh) + 0x1p-24 + rounding_bound(d);
    EXPECT_LE(relative_error_matching_nans(first.dh, cpu_grads.dh), dh_bound);
    EXPECT_LE(relative_error_matching_nans(first.dweight, cpu_grads.dweight), f32_bound + rounding_bound(d));
    EXPECT_LE(relative_error_matching_nans(first.dbias, cpu_grads.dbias), f32_bound + rounding_bound(d));
    const auto second = kernels::add_layernorm_backward(dyg, dresg, xg, wg, gpu.mean, gpu.rstd);
    EXPECT_TRUE(same_bits(second.dh, first.dh));
    EXPECT_TRUE(same_bits(second.dweight, first.dweight));
    EXPECT_TRUE(same_bits(second.dbias, first.dbias));
  }
}

}  // namespace
}  // namespace octet
