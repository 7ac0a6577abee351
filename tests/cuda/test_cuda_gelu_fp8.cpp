// The one-pass GPU GELU writing FP8 (kernels/fp8.h gelu_fp8_forward, dgelu_fp8_cast_dbias):
//   - against the unfused GPU sequence each replaces, gelu_forward then fp8_cast, and gelu_backward
//     then fp8_cast_dbias (fp8_cast without a bias), bit for bit: the bytes, the transposed copy and
//     its padding, amax, scale_inv and dbias. The fused kernels are the cast's own tile kernel with
//     GELU's own element functions, so nothing may differ.
//   - against the CPU's: the two GELUs may differ in the last bit of an element (expf, normcdff); where
//     they agree, the FP8 bytes must too, and dbias is held to a bound derived below.
//   - that neither allocates the GELU's output (its backward's dy) in x's dtype.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <ostream>
#include <vector>

#include "core/cuda_memory.h"
#include "kernels/fp8.h"
#include "kernels/nn_ops.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/cuda/fp8_cast_testing.h"
#include "tests/testing.h"

namespace octet {
namespace {

using kernels::GeluApproximation;
using testing::bytes_of;
using testing::kGpu;
using testing::misaligned_on_gpu;
using testing::random_tensor;
using testing::same_bits;

constexpr double kScale = 37.5;      // GELU outputs of a spread-3 x past 448 / 37.5 ≈ 12 saturate e4m3
constexpr double kAmaxStart = 0.25;  // a non-zero slot, raised by every case with rows here

using Copies = testing::Fp8Copies;
constexpr const auto& kCopies = testing::kFp8Copies;

const char* name(GeluApproximation a) { return a == GeluApproximation::Tanh ? "tanh" : "erf"; }

// The fused forward on the GPU against gelu_forward then fp8_cast, everything bit for bit.
void expect_forward_same_as_unfused(const Tensor& x, GeluApproximation approximation, DType format, Copies copies,
                                    int64_t pad_rows_to = 16) {
  const Tensor scale = full({1}, kScale, DType::f32, kGpu);
  const Tensor amax_fused = full({1}, kAmaxStart, DType::f32, kGpu), amax_ref = amax_fused.clone();
  const kernels::Fp8Cast got = kernels::gelu_fp8_forward(x, approximation, scale, amax_fused, format, copies.rowwise,
                                                         copies.transposed, pad_rows_to);
  const kernels::Fp8Cast want = kernels::fp8_cast(kernels::gelu_forward(x, approximation), scale, amax_ref, format,
                                                  copies.rowwise, copies.transposed, pad_rows_to);
  EXPECT_EQ(got.data.defined(), copies.rowwise);
  EXPECT_EQ(got.transposed.defined(), copies.transposed);
  if (copies.rowwise) {
    EXPECT_TRUE(got.data.is_cuda());
    EXPECT_TRUE(same_bits(got.data, want.data)) << "row-major copy";
  }
  if (copies.transposed) {
    EXPECT_TRUE(same_bits(got.transposed, want.transposed)) << "transposed copy";
  }
  EXPECT_TRUE(same_bits(got.scale_inv, want.scale_inv)) << "scale_inv";
  EXPECT_TRUE(same_bits(amax_fused, amax_ref)) << "amax";
}

// The unfused backward: gelu_backward, then fp8_cast_dbias (or fp8_cast without a bias).
kernels::Fp8CastWithBiasGrad unfused_backward(const Tensor& dact, const Tensor& x, GeluApproximation approximation,
                                              const Tensor& scale, const Tensor& amax, DType format, Copies copies,
                                              std::optional<DType> dbias_dtype, int64_t pad_rows_to) {
  const Tensor dy = kernels::gelu_backward(dact, x, approximation);
  if (dbias_dtype) {
    return kernels::fp8_cast_dbias(dy, scale, amax, format, copies.rowwise, copies.transposed, *dbias_dtype,
                                   pad_rows_to);
  }
  kernels::Fp8CastWithBiasGrad out;
  static_cast<kernels::Fp8Cast&>(out) =
      kernels::fp8_cast(dy, scale, amax, format, copies.rowwise, copies.transposed, pad_rows_to);
  return out;
}

// The fused backward on the GPU against the unfused GPU sequence, everything bit for bit.
void expect_backward_same_as_unfused(const Tensor& dact, const Tensor& x, GeluApproximation approximation,
                                     DType format, Copies copies, std::optional<DType> dbias_dtype,
                                     int64_t pad_rows_to = 16) {
  const Tensor scale = full({1}, kScale, DType::f32, kGpu);
  const Tensor amax_fused = full({1}, kAmaxStart, DType::f32, kGpu), amax_ref = amax_fused.clone();
  const kernels::Fp8CastWithBiasGrad got =
      kernels::dgelu_fp8_cast_dbias(dact, x, approximation, scale, amax_fused, format, copies.rowwise,
                                    copies.transposed, dbias_dtype, pad_rows_to);
  const kernels::Fp8CastWithBiasGrad want =
      unfused_backward(dact, x, approximation, scale, amax_ref, format, copies, dbias_dtype, pad_rows_to);
  EXPECT_EQ(got.data.defined(), copies.rowwise);
  EXPECT_EQ(got.transposed.defined(), copies.transposed);
  if (copies.rowwise) {
    EXPECT_TRUE(same_bits(got.data, want.data)) << "row-major copy";
  }
  if (copies.transposed) {
    EXPECT_TRUE(same_bits(got.transposed, want.transposed)) << "transposed copy";
  }
  EXPECT_TRUE(same_bits(got.scale_inv, want.scale_inv)) << "scale_inv";
  EXPECT_TRUE(same_bits(amax_fused, amax_ref)) << "amax";
  EXPECT_EQ(got.dbias.defined(), dbias_dtype.has_value());
  if (dbias_dtype) {
    EXPECT_TRUE(got.dbias.is_cuda());
    EXPECT_TRUE(same_bits(got.dbias, want.dbias)) << "dbias";
  }
}

struct Shape2 {
  int64_t rows, cols;
};
void PrintTo(const Shape2& s, std::ostream* os) { *os << s.rows << "x" << s.cols; }

class CudaGeluFp8 : public ::testing::TestWithParam<Shape2> {};

// Rows below, at and past one 64-row tile and not a multiple of it; widths below and past the 64-column
// tile, not a multiple of it, and 1280 (ViT-H's hidden width over 4).
TEST_P(CudaGeluFp8, EqualsTheUnfusedGpuSequenceBitForBit) {
  SKIP_WITHOUT_GPU();
  const auto [rows, cols] = GetParam();
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    const Tensor x = random_tensor({rows, cols}, dtype, 100 + rows + cols, 3.0).to(kGpu);
    const Tensor dact = random_tensor({rows, cols}, dtype, 200 + rows + cols).to(kGpu);
    for (GeluApproximation approximation : {GeluApproximation::None, GeluApproximation::Tanh}) {
      for (DType format : {DType::e4m3, DType::e5m2}) {
        for (Copies copies : kCopies) {
          SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " " << name(approximation) << " -> "
                                            << dtype_name(format) << (copies.rowwise ? " rowwise" : "")
                                            << (copies.transposed ? " transposed" : ""));
          expect_forward_same_as_unfused(x, approximation, format, copies);
          for (std::optional<DType> dbias : {std::optional<DType>(), std::optional<DType>(DType::f32),
                                             std::optional<DType>(DType::bf16)}) {
            SCOPED_TRACE(dbias ? dtype_name(*dbias) : "no dbias");
            expect_backward_same_as_unfused(dact, x, approximation, format, copies, dbias);
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaGeluFp8,
                         ::testing::Values(Shape2{1, 16}, Shape2{1, 80}, Shape2{1, 144}, Shape2{1, 1280},
                                           Shape2{37, 16}, Shape2{37, 80}, Shape2{37, 144}, Shape2{37, 1280},
                                           Shape2{130, 16}, Shape2{130, 80}, Shape2{130, 144}, Shape2{130, 1280},
                                           Shape2{4097, 16}, Shape2{4097, 80}, Shape2{4097, 144},
                                           Shape2{4097, 1280}));

// The paths the shapes above do not take: misaligned inputs (scalar loads; for the backward, dact and x
// misaligned alone and together), widths that are not a multiple of 4, other row paddings, a leading
// batch dim, an f16 bias, NaN and inf in x and dact (NaN must reach the amax with the unfused bits),
// and no rows.
TEST(CudaGeluFp8Paths, EqualsTheUnfusedGpuSequenceBitForBit) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::f16, DType::bf16, DType::f32}) {
    for (int64_t cols : {53, 64, 1030}) {
      const int64_t rows = 45;
      const Tensor x_host = random_tensor({rows, cols}, dtype, 500 + cols, 3.0);
      const Tensor dact_host = random_tensor({rows, cols}, dtype, 600 + cols);
      for (int misaligned = 0; misaligned < 4; ++misaligned) {  // bit 0: x, bit 1: dact
        const Tensor x = misaligned & 1 ? misaligned_on_gpu(x_host) : x_host.to(kGpu);
        const Tensor dact = misaligned & 2 ? misaligned_on_gpu(dact_host) : dact_host.to(kGpu);
        for (int64_t pad : {1, 16, 64}) {
          for (GeluApproximation approximation : {GeluApproximation::None, GeluApproximation::Tanh}) {
            SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " cols " << cols << " misaligned " << misaligned
                                              << " pad " << pad << " " << name(approximation));
            expect_forward_same_as_unfused(x, approximation, DType::e4m3, {true, true}, pad);
            expect_backward_same_as_unfused(dact, x, approximation, DType::e5m2, {true, true}, DType::f16, pad);
            expect_backward_same_as_unfused(dact, x, approximation, DType::e4m3, {false, true}, DType::f32, pad);
          }
        }
      }
    }
  }
  // A width the 16-byte path takes (1032 = 16 tiles and 8 columns), with x and dact 8 bytes past a
  // 16-byte boundary (the scalar path) and aligned (the 16-byte path with a partial column tile).
  for (DType dtype : {DType::f16, DType::bf16, DType::f32}) {
    const int64_t rows = 45, cols = 1032, offset = static_cast<int64_t>(8 / dtype_size(dtype));
    const Tensor x_host = random_tensor({rows, cols}, dtype, 550, 3.0);
    const Tensor dact_host = random_tensor({rows, cols}, dtype, 650);
    for (bool misaligned : {false, true}) {
      const Tensor x = misaligned ? misaligned_on_gpu(x_host, offset) : x_host.to(kGpu);
      const Tensor dact = misaligned ? misaligned_on_gpu(dact_host, offset) : dact_host.to(kGpu);
      for (GeluApproximation approximation : {GeluApproximation::None, GeluApproximation::Tanh}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " cols 1032" << (misaligned ? " 8 bytes off" : "")
                                          << " " << name(approximation));
        expect_forward_same_as_unfused(x, approximation, DType::e4m3, {true, true});
        expect_forward_same_as_unfused(x, approximation, DType::e5m2, {false, true}, 5);
        expect_backward_same_as_unfused(dact, x, approximation, DType::e5m2, {true, true}, DType::bf16);
        expect_backward_same_as_unfused(dact, x, approximation, DType::e4m3, {true, false}, DType::f32);
      }
    }
  }
  for (DType dtype : {DType::f16, DType::bf16, DType::f32}) {
    SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " [3, 33, 96] with NaN and inf");
    Tensor x = random_tensor({3, 33, 96}, DType::f32, 900, 3.0);
    Tensor dact = random_tensor({3, 33, 96}, DType::f32, 901);
    x.data<float>()[5 * 96 + 7] = std::numeric_limits<float>::quiet_NaN();
    x.data<float>()[40 * 96 + 1] = std::numeric_limits<float>::infinity();
    x.data<float>()[41 * 96 + 2] = -std::numeric_limits<float>::infinity();
    dact.data<float>()[70 * 96 + 3] = std::numeric_limits<float>::quiet_NaN();
    const Tensor xg = x.to(dtype).to(kGpu), dg = dact.to(dtype).to(kGpu);
    for (GeluApproximation approximation : {GeluApproximation::None, GeluApproximation::Tanh}) {
      expect_forward_same_as_unfused(xg, approximation, DType::e4m3, {true, true});
      expect_backward_same_as_unfused(dg, xg, approximation, DType::e5m2, {true, true}, DType::f32);
    }
  }
  // No rows: scale_inv is still written, the amax left alone, dbias all zeros.
  const Tensor none = empty({0, 96}, DType::bf16, kGpu);
  expect_forward_same_as_unfused(none, GeluApproximation::None, DType::e4m3, {true, true});
  expect_backward_same_as_unfused(none, none, GeluApproximation::Tanh, DType::e5m2, {true, true}, DType::bf16);
}

// ViT-H's MLP at batch 64 (12,608 tokens, hidden width 5120, bf16, the erf form): the fused forward and
// backward against the unfused GPU sequence, bit for bit, and the unfused sequence's casts against the
// CPU's cast of the same GELU output (gelu_forward's, gelu_backward's, copied to the host), bit for bit
// but dbias (the bound of test_cuda_fp8.cpp's fp8_cast_dbias, checked there; here the GPU's dbias must
// equal the unfused sequence's).
TEST(CudaGeluFp8ViT, HiddenWidthAtBatch64EqualsTheUnfusedSequenceAndTheCpuCast) {
  SKIP_WITHOUT_GPU();
  const int64_t rows = 12608, cols = 5120;
  const Tensor x = random_tensor({rows, cols}, DType::bf16, 1700, 2.0).to(kGpu);
  const Tensor dact = random_tensor({rows, cols}, DType::bf16, 1701, 0.01).to(kGpu);
  expect_forward_same_as_unfused(x, GeluApproximation::None, DType::e4m3, {true, true});
  expect_backward_same_as_unfused(dact, x, GeluApproximation::None, DType::e5m2, {true, true}, DType::bf16);
  const Tensor scale = full({1}, kScale), scale_gpu = scale.to(kGpu);
  for (bool backward : {false, true}) {
    SCOPED_TRACE(backward ? "gelu_backward" : "gelu_forward");
    const Tensor y = backward ? kernels::gelu_backward(dact, x, GeluApproximation::None)
                              : kernels::gelu_forward(x, GeluApproximation::None);
    const DType format = backward ? DType::e5m2 : DType::e4m3;
    const Tensor amax_cpu = full({1}, kAmaxStart), amax_gpu = amax_cpu.to(kGpu);
    const kernels::Fp8Cast gpu = kernels::fp8_cast(y, scale_gpu, amax_gpu, format, true, true);
    const kernels::Fp8Cast cpu = kernels::fp8_cast(y.to(Device::cpu()), scale, amax_cpu, format, true, true);
    EXPECT_TRUE(same_bits(gpu.data, cpu.data)) << "row-major copy";
    EXPECT_TRUE(same_bits(gpu.transposed, cpu.transposed)) << "transposed copy";
    EXPECT_TRUE(same_bits(amax_gpu, amax_cpu)) << "amax";
    EXPECT_TRUE(same_bits(gpu.scale_inv, cpu.scale_inv)) << "scale_inv";
  }
}

// |v| as a bit pattern, and the largest over a tensor read as f32 (how the casts measure amax).
uint32_t magnitude_bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return u & 0x7FFFFFFFu;
}
uint32_t amax_bits_of(const Tensor& t, uint32_t start) {
  const std::vector<float> v = t.to(Device::cpu()).to(DType::f32).to_vector<float>();
  uint32_t m = start;
  for (float f : v) m = std::max(m, magnitude_bits(f));
  return m;
}

// Unit roundoff of a rounding to d (0 for f32, which the sums already are).
double unit_roundoff(DType d) {
  if (d == DType::bf16) return std::ldexp(1.0, -8);
  if (d == DType::f16) return std::ldexp(1.0, -11);
  return 0.0;
}

// The fused op on the GPU against the CPU's (which runs the unfused sequence), given each device's
// GELU output (dy) in x's dtype from its unfused op. Where the two outputs agree the FP8 bytes must
// too, so the mismatched bytes are at most the mismatched elements; each amax is the largest of its
// own device's outputs, and the two are equal when the outputs are.
//
// dbias. Let y_g, y_c be the two devices' outputs of column c and n = rows. Each device sums its
// column in f32 in some order, within (n-1)·u·Σ|y| of the exact sum (u = 2^-24); the exact sums
// differ by at most d_c = Σ|y_g - y_c|. So the two f32 sums are within
//   e_c = d_c + n·u·(Σ|y_g| + Σ|y_c|)
// of each other. Each is then rounded to x's dtype and to dbias_dtype, relative roundoff
// u_out = u(x dtype) + u(dbias dtype) at most (for normal values), which gives, as for fp8_cast_dbias
// (tests/cuda/test_cuda_fp8.cpp),
//   |dbias_gpu[c] - dbias_cpu[c]| <= e_c·(1 + u_out) + 2·u_out·(|dbias_cpu[c]|·(1 + 2·u_out) + e_c).
struct CpuCase {
  Tensor y_cpu, y_gpu;                    // each device's unfused output in x's dtype
  kernels::Fp8CastWithBiasGrad cpu, gpu;  // the fused op on each device (dbias undefined for the forward)
  Tensor amax_cpu, amax_gpu;
};

void expect_close_to_cpu(const CpuCase& k, int64_t rows, int64_t cols) {
  const std::vector<uint8_t> yc = bytes_of(k.y_cpu), yg = bytes_of(k.y_gpu);
  const std::vector<uint8_t> dc = bytes_of(k.cpu.data), dg = bytes_of(k.gpu.data);
  const std::vector<uint8_t> tc = bytes_of(k.cpu.transposed), tg = bytes_of(k.gpu.transposed);
  const size_t es = k.y_cpu.element_size();
  const int64_t padded = k.cpu.transposed.size(1);
  int64_t y_mismatched = 0, data_mismatched = 0, bytes_where_equal = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t col = 0; col < cols; ++col) {
      const size_t i = static_cast<size_t>(r * cols + col), t = static_cast<size_t>(col * padded + r);
      const bool y_equal = std::memcmp(&yc[i * es], &yg[i * es], es) == 0;
      y_mismatched += !y_equal;
      data_mismatched += dc[i] != dg[i];
      if (y_equal && (dc[i] != dg[i] || tc[t] != tg[t])) ++bytes_where_equal;
    }
  }
  EXPECT_EQ(bytes_where_equal, 0) << "FP8 bytes differ where the GELU outputs agree";
  EXPECT_LE(data_mismatched, y_mismatched);
  for (int64_t col = 0; col < cols; ++col) {
    for (int64_t r = rows; r < padded; ++r) {
      EXPECT_EQ(tg[static_cast<size_t>(col * padded + r)], 0) << "padding of column " << col;
    }
  }
  const uint32_t start = magnitude_bits(static_cast<float>(kAmaxStart));
  EXPECT_EQ(magnitude_bits(k.amax_gpu.item<float>()), amax_bits_of(k.y_gpu, start));
  EXPECT_EQ(magnitude_bits(k.amax_cpu.item<float>()), amax_bits_of(k.y_cpu, start));
  if (y_mismatched == 0) {
    EXPECT_TRUE(same_bits(k.amax_gpu, k.amax_cpu));
  }
  EXPECT_TRUE(same_bits(k.gpu.scale_inv, k.cpu.scale_inv));
  if (!k.cpu.dbias.defined()) return;
  ASSERT_TRUE(k.gpu.dbias.defined());
  ASSERT_EQ(k.gpu.dbias.dtype(), k.cpu.dbias.dtype());
  const std::vector<double> ygv = k.y_gpu.to(Device::cpu()).to_vector<double>(), ycv = k.y_cpu.to_vector<double>();
  const std::vector<double> want = k.cpu.dbias.to_vector<double>();
  const std::vector<double> got = k.gpu.dbias.to(Device::cpu()).to_vector<double>();
  const double u = std::ldexp(1.0, -24);
  const double u_out = unit_roundoff(k.y_cpu.dtype()) + unit_roundoff(k.cpu.dbias.dtype());
  for (int64_t col = 0; col < cols; ++col) {
    double d = 0, abs_g = 0, abs_c = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const size_t i = static_cast<size_t>(r * cols + col);
      d += std::abs(ygv[i] - ycv[i]);
      abs_g += std::abs(ygv[i]);
      abs_c += std::abs(ycv[i]);
    }
    const double e = d + static_cast<double>(rows) * u * (abs_g + abs_c);
    const double bound = e * (1 + u_out) + 2 * u_out * (std::abs(want[col]) * (1 + 2 * u_out) + e);
    EXPECT_LE(std::abs(got[col] - want[col]), bound)
        << "dbias[" << col << "]: gpu " << got[col] << ", cpu " << want[col];
  }
}

TEST(CudaGeluFp8Cpu, BytesEqualWhereTheGelusAgree) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (const Shape2 s : {Shape2{37, 80}, Shape2{130, 144}, Shape2{300, 1280}}) {
      for (GeluApproximation approximation : {GeluApproximation::None, GeluApproximation::Tanh}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " " << s.rows << "x" << s.cols << " "
                                          << name(approximation));
        const Tensor x = random_tensor({s.rows, s.cols}, dtype, 1000 + s.cols, 3.0);
        const Tensor dact = random_tensor({s.rows, s.cols}, dtype, 1100 + s.cols);
        const Tensor xg = x.to(kGpu), dg = dact.to(kGpu);
        const Tensor scale = full({1}, kScale), scale_gpu = scale.to(kGpu);
        {
          SCOPED_TRACE("gelu_fp8_forward");
          CpuCase k;
          k.amax_cpu = full({1}, kAmaxStart), k.amax_gpu = k.amax_cpu.to(kGpu);
          static_cast<kernels::Fp8Cast&>(k.cpu) =
              kernels::gelu_fp8_forward(x, approximation, scale, k.amax_cpu, DType::e4m3, true, true);
          static_cast<kernels::Fp8Cast&>(k.gpu) =
              kernels::gelu_fp8_forward(xg, approximation, scale_gpu, k.amax_gpu, DType::e4m3, true, true);
          k.y_cpu = kernels::gelu_forward(x, approximation);
          k.y_gpu = kernels::gelu_forward(xg, approximation);
          expect_close_to_cpu(k, s.rows, s.cols);
        }
        for (std::optional<DType> dbias : {std::optional<DType>(DType::f32), std::optional<DType>(DType::bf16),
                                           std::optional<DType>()}) {
          SCOPED_TRACE(::testing::Message() << "dgelu_fp8_cast_dbias, dbias " << (dbias ? dtype_name(*dbias) : "none"));
          CpuCase k;
          k.amax_cpu = full({1}, kAmaxStart), k.amax_gpu = k.amax_cpu.to(kGpu);
          k.cpu = kernels::dgelu_fp8_cast_dbias(dact, x, approximation, scale, k.amax_cpu, DType::e5m2, true, true,
                                                dbias);
          k.gpu = kernels::dgelu_fp8_cast_dbias(dg, xg, approximation, scale_gpu, k.amax_gpu, DType::e5m2, true, true,
                                                dbias);
          EXPECT_EQ(k.gpu.dbias.defined(), dbias.has_value());
          k.y_cpu = kernels::gelu_backward(dact, x, approximation);
          k.y_gpu = kernels::gelu_backward(dg, xg, approximation);
          expect_close_to_cpu(k, s.rows, s.cols);
        }
      }
    }
  }
}

// The point of the fusion: no tensor of the GELU's output (dy) in x's dtype. The device's allocation
// peak during the op stays within its outputs plus a quarter of that tensor (an f32 x here, so the
// tensor would be twice the two FP8 copies). The backward's column partials, freed before it returns,
// are 4 bytes per column per 64 rows, 1/64 of that tensor, well inside the quarter.
TEST(CudaGeluFp8Memory, NeverAllocatesTheGeluOutput) {
  SKIP_WITHOUT_GPU();
  const int64_t rows = 4097, cols = 1280;
  const Tensor x = random_tensor({rows, cols}, DType::f32, 1400, 3.0).to(kGpu);
  const Tensor dact = random_tensor({rows, cols}, DType::f32, 1500).to(kGpu);
  const Tensor scale = full({1}, kScale, DType::f32, kGpu), amax = full({1}, 0.0, DType::f32, kGpu);
  const size_t gelu_output = static_cast<size_t>(rows * cols) * sizeof(float);
  {
    SCOPED_TRACE("gelu_fp8_forward");
    const size_t before = cuda_memory::memory_stats(0).in_use;
    cuda_memory::reset_peak_memory_stats(0);
    const kernels::Fp8Cast out =
        kernels::gelu_fp8_forward(x, GeluApproximation::Tanh, scale, amax, DType::e4m3, true, true);
    const size_t peak_rise = cuda_memory::memory_stats(0).peak - before;
    const size_t outputs = out.data.nbytes() + out.transposed.nbytes() + out.scale_inv.nbytes();
    EXPECT_LT(peak_rise, outputs + gelu_output / 4);
  }
  for (std::optional<DType> dbias : {std::optional<DType>(DType::f32), std::optional<DType>()}) {
    SCOPED_TRACE(dbias ? "dgelu_fp8_cast_dbias with dbias" : "dgelu_fp8_cast_dbias");
    const size_t before = cuda_memory::memory_stats(0).in_use;
    cuda_memory::reset_peak_memory_stats(0);
    const kernels::Fp8CastWithBiasGrad out = kernels::dgelu_fp8_cast_dbias(
        dact, x, GeluApproximation::None, scale, amax, DType::e5m2, true, true, dbias);
    const size_t peak_rise = cuda_memory::memory_stats(0).peak - before;
    size_t outputs = out.data.nbytes() + out.transposed.nbytes() + out.scale_inv.nbytes();
    if (dbias) outputs += out.dbias.nbytes();
    EXPECT_LT(peak_rise, outputs + gelu_output / 4);
  }
}

}  // namespace
}  // namespace octet
