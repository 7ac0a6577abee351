// The one-pass GPU LayerNorm writing FP8 (kernels/fp8.h layernorm_fp8_forward, add_layernorm_fp8_forward):
//   - against the unfused GPU sequence it replaces, layernorm_forward (add_layernorm_forward) then
//     fp8_cast, bit for bit: the bytes, the transposed copy and its padding, amax, scale_inv, mean,
//     rstd and h. The fused kernel runs the same device functions in the same reduction layout, so
//     nothing may differ.
//   - against the CPU's: the two LayerNorms sum in different orders, so their outputs may differ in the
//     last bit here and there; wherever they are equal, the FP8 bytes must be too.
//   - that it never allocates the LayerNorm's output in x's dtype.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
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

using testing::bytes_of;
using testing::kGpu;
using testing::misaligned_on_gpu;
using testing::random_tensor;
using testing::relative_error_matching_nans;
using testing::same_bits;

constexpr double kEps = 1e-5;
constexpr double kScale = 37.5;       // some outputs of a spread-2 weight saturate e4m3
constexpr double kAmaxStart = 0.25;  // a non-zero slot, raised by every case here

struct Inputs {
  Tensor x, y, weight, bias;  // y (the residual branch) undefined for layernorm_fp8_forward
};

using Copies = testing::Fp8Copies;
constexpr const auto& kCopies = testing::kFp8Copies;

kernels::LayerNormFp8 fused(const Inputs& in, const Tensor& scale, const Tensor& amax, DType format, Copies copies,
                            int64_t pad_rows_to) {
  if (in.y.defined()) {
    return kernels::add_layernorm_fp8_forward(in.x, in.y, in.weight, in.bias, kEps, scale, amax, format,
                                              copies.rowwise, copies.transposed, pad_rows_to);
  }
  return kernels::layernorm_fp8_forward(in.x, in.weight, in.bias, kEps, scale, amax, format, copies.rowwise,
                                        copies.transposed, pad_rows_to);
}

// What the fused op replaces: the LayerNorm's output (and h, mean, rstd) in x's dtype, then its cast.
struct Unfused {
  Tensor normed, h, mean, rstd;
  kernels::Fp8Cast cast;
};
Unfused unfused(const Inputs& in, const Tensor& scale, const Tensor& amax, DType format, Copies copies,
                int64_t pad_rows_to) {
  Unfused u;
  if (in.y.defined()) {
    const kernels::AddLayerNormOutput r = kernels::add_layernorm_forward(in.x, in.y, in.weight, in.bias, kEps);
    u.normed = r.y, u.h = r.h, u.mean = r.mean, u.rstd = r.rstd;
  } else {
    const kernels::LayerNormOutput r = kernels::layernorm_forward(in.x, in.weight, in.bias, kEps);
    u.normed = r.y, u.mean = r.mean, u.rstd = r.rstd;
  }
  u.cast = kernels::fp8_cast(u.normed, scale, amax, format, copies.rowwise, copies.transposed, pad_rows_to);
  return u;
}

// The fused op on the GPU against the unfused GPU sequence, everything bit for bit. `in` is on the GPU.
void expect_same_as_unfused(const Inputs& in, DType format, Copies copies, int64_t pad_rows_to = 16) {
  const Tensor scale = full({1}, kScale, DType::f32, kGpu);
  const Tensor amax_fused = full({1}, kAmaxStart, DType::f32, kGpu), amax_ref = amax_fused.clone();
  const kernels::LayerNormFp8 got = fused(in, scale, amax_fused, format, copies, pad_rows_to);
  const Unfused want = unfused(in, scale, amax_ref, format, copies, pad_rows_to);
  EXPECT_EQ(got.cast.data.defined(), copies.rowwise);
  EXPECT_EQ(got.cast.transposed.defined(), copies.transposed);
  if (copies.rowwise) {
    EXPECT_TRUE(got.cast.data.is_cuda());
    EXPECT_TRUE(same_bits(got.cast.data, want.cast.data)) << "row-major copy";
  }
  if (copies.transposed) {
    EXPECT_TRUE(same_bits(got.cast.transposed, want.cast.transposed)) << "transposed copy";
  }
  EXPECT_TRUE(same_bits(got.cast.scale_inv, want.cast.scale_inv)) << "scale_inv";
  EXPECT_TRUE(same_bits(amax_fused, amax_ref)) << "amax";
  EXPECT_TRUE(same_bits(got.mean, want.mean)) << "mean";
  EXPECT_TRUE(same_bits(got.rstd, want.rstd)) << "rstd";
  EXPECT_EQ(got.h.defined(), in.y.defined());
  if (in.y.defined()) {
    EXPECT_TRUE(same_bits(got.h, want.h)) << "h";
  }
}

struct Shape2 {
  int64_t rows, cols;
};
void PrintTo(const Shape2& s, std::ostream* os) { *os << s.rows << "x" << s.cols; }

class CudaLayerNormFp8 : public ::testing::TestWithParam<Shape2> {};

// Rows below, at and past one 32-row tile and not a multiple of it; widths below and past the 64-column
// chunk of the block-per-row kernel, not a multiple of it, 1280 (ViT-H; a warp per row for bf16, a
// block per row for f32), and around the warp-per-row kernel's limits: one element, a unit (8 bf16,
// 4 f32) not filled, 2048 (the most a warp holds for bf16, a 64 KiB tile) and 2049 (a block per row);
// 12608 x 1280 is ViT-H's LayerNorm at batch 64.
TEST_P(CudaLayerNormFp8, EqualsTheUnfusedGpuSequenceBitForBit) {
  SKIP_WITHOUT_GPU();
  const auto [rows, C] = GetParam();
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Tensor x = random_tensor({rows, C}, dtype, 100 + rows + C, 3.0).to(kGpu);
    const Tensor y = random_tensor({rows, C}, dtype, 200 + rows + C).to(kGpu);
    for (bool affine : {false, true}) {
      const Tensor w = affine ? random_tensor({C}, DType::f32, 300 + C, 2.0).to(kGpu) : Tensor();
      const Tensor b = affine ? random_tensor({C}, DType::f32, 400 + C).to(kGpu) : Tensor();
      for (bool residual : {false, true}) {
        for (DType format : {DType::e4m3, DType::e5m2}) {
          for (Copies copies : kCopies) {
            SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " -> " << dtype_name(format)
                                              << (affine ? " affine" : "") << (residual ? " residual" : "")
                                              << (copies.rowwise ? " rowwise" : "")
                                              << (copies.transposed ? " transposed" : ""));
            expect_same_as_unfused({x, residual ? y : Tensor(), w, b}, format, copies);
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaLayerNormFp8,
                         ::testing::Values(Shape2{1, 16}, Shape2{1, 1280}, Shape2{37, 96}, Shape2{37, 80},
                                           Shape2{37, 144}, Shape2{37, 1280}, Shape2{130, 16}, Shape2{130, 80},
                                           Shape2{130, 144}, Shape2{130, 1280}, Shape2{4097, 96},
                                           Shape2{4097, 144}, Shape2{4097, 1280}, Shape2{1, 1}, Shape2{33, 7},
                                           Shape2{65, 2048}, Shape2{65, 2049}, Shape2{12608, 1280}));

// The paths the shapes above do not take: f16 inputs, f32 weights of a bf16 or f16 x (a weight is f32
// or x's dtype; any other is refused, as below), misaligned rows (scalar loads and stores),
// misaligned weights (loaded one at a time), widths that are not a multiple of 4 in both modes, other
// row paddings, a leading batch dim, and NaN and inf in x (NaN must reach the amax with the unfused
// bits).
TEST(CudaLayerNormFp8Paths, EqualsTheUnfusedGpuSequenceBitForBit) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::f16, DType::bf16, DType::f32}) {
    for (int64_t C : {53, 64, 1030, 2048}) {
      const int64_t rows = 45;
      const Tensor x_host = random_tensor({rows, C}, dtype, 500 + C, 3.0);
      const Tensor y_host = random_tensor({rows, C}, dtype, 600 + C);
      const Tensor w_other = random_tensor({C}, DType::f32, 700 + C, 2.0);
      const Tensor b_other = random_tensor({C}, w_other.dtype(), 800 + C);
      for (bool misaligned : {false, true}) {
        const Tensor x = misaligned ? misaligned_on_gpu(x_host) : x_host.to(kGpu);
        const Tensor y = misaligned ? misaligned_on_gpu(y_host) : y_host.to(kGpu);
        for (bool residual : {false, true}) {
          for (int64_t pad : {1, 16, 64}) {
            SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " C " << C << (misaligned ? " misaligned" : "")
                                              << (residual ? " residual" : "") << " pad " << pad);
            expect_same_as_unfused({x, residual ? y : Tensor(), w_other.to(kGpu), b_other.to(kGpu)}, DType::e4m3,
                                   {true, true}, pad);
            // A weight without a bias.
            expect_same_as_unfused({x, residual ? y : Tensor(), w_other.to(kGpu), Tensor()}, DType::e5m2,
                                   {false, true}, pad);
            // Weight and bias one element past a 16-byte boundary.
            expect_same_as_unfused(
                {x, residual ? y : Tensor(), misaligned_on_gpu(w_other), misaligned_on_gpu(b_other)}, DType::e4m3,
                {true, true}, pad);
          }
        }
      }
    }
  }
  for (DType dtype : {DType::f16, DType::bf16, DType::f32}) {
    SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " [3, 33, 96] with NaN and inf");
    Tensor x = random_tensor({3, 33, 96}, DType::f32, 900, 2.0);
    x.data<float>()[5 * 96 + 7] = std::numeric_limits<float>::quiet_NaN();
    x.data<float>()[40 * 96 + 1] = std::numeric_limits<float>::infinity();
    expect_same_as_unfused({x.to(dtype).to(kGpu), Tensor(), Tensor(), Tensor()}, DType::e4m3, {true, true});
  }
  // A weight neither f32 nor x's dtype is refused before any kernel, naming the fix.
  EXPECT_TRUE(testing::throws_with(
      [&] {
        kernels::layernorm_fp8_forward(random_tensor({4, 64}, DType::f32, 950).to(kGpu),
                                       random_tensor({64}, DType::bf16, 951).to(kGpu), Tensor(), kEps,
                                       full({1}, 1.0, DType::f32, kGpu), Tensor(), DType::e4m3, true, false);
      },
      {"layernorm_fp8_forward", "weight is bf16 but x is f32", ".to(DType::f32)"}));
  // No rows: scale_inv is still written, the amax left alone.
  expect_same_as_unfused({empty({0, 96}, DType::bf16, kGpu), Tensor(), Tensor(), Tensor()}, DType::e4m3,
                         {true, true});
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

// The fused op on the GPU against the CPU's (which runs the unfused sequence). Their LayerNorms may
// differ in the last bit of an element; where they are equal, so must the FP8 bytes be, so the
// mismatched bytes are at most the mismatched LayerNorm elements. Each amax is the largest of its own
// LayerNorm's outputs, and the two are equal when the LayerNorms are.
TEST(CudaLayerNormFp8Cpu, BytesEqualWhereTheLayerNormsAgree) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (const Shape2 s : {Shape2{37, 96}, Shape2{130, 144}, Shape2{300, 1280}}) {
      for (bool residual : {false, true}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " " << s.rows << "x" << s.cols
                                          << (residual ? " residual" : ""));
        const Inputs cpu{random_tensor({s.rows, s.cols}, dtype, 1000 + s.cols, 3.0),
                         residual ? random_tensor({s.rows, s.cols}, dtype, 1100 + s.cols) : Tensor(),
                         random_tensor({s.cols}, DType::f32, 1200 + s.cols, 2.0),
                         random_tensor({s.cols}, DType::f32, 1300 + s.cols)};
        const Inputs gpu{cpu.x.to(kGpu), residual ? cpu.y.to(kGpu) : Tensor(), cpu.weight.to(kGpu),
                         cpu.bias.to(kGpu)};
        const Tensor scale = full({1}, kScale);
        const Tensor amax_cpu = full({1}, kAmaxStart), amax_gpu = amax_cpu.to(kGpu);
        const Copies both{true, true};
        const kernels::LayerNormFp8 c = fused(cpu, scale, amax_cpu, DType::e4m3, both, 16);
        const kernels::LayerNormFp8 g = fused(gpu, scale.to(kGpu), amax_gpu, DType::e4m3, both, 16);
        // Each device's LayerNorm output in x's dtype, from its unfused LayerNorm.
        const Tensor scratch_amax_cpu = full({1}, 0.0), scratch_amax_gpu = full({1}, 0.0, DType::f32, kGpu);
        const Tensor y_cpu = unfused(cpu, scale, scratch_amax_cpu, DType::e4m3, both, 16).normed;
        const Tensor y_gpu = unfused(gpu, scale.to(kGpu), scratch_amax_gpu, DType::e4m3, both, 16).normed;

        const std::vector<uint8_t> yc = bytes_of(y_cpu), yg = bytes_of(y_gpu);
        const std::vector<uint8_t> dc = bytes_of(c.cast.data), dg = bytes_of(g.cast.data);
        const std::vector<uint8_t> tc = bytes_of(c.cast.transposed), tg = bytes_of(g.cast.transposed);
        const size_t es = y_cpu.element_size();
        const int64_t padded = c.cast.transposed.size(1);
        int64_t y_mismatched = 0, data_mismatched = 0, bytes_where_equal = 0;
        for (int64_t r = 0; r < s.rows; ++r) {
          for (int64_t col = 0; col < s.cols; ++col) {
            const size_t i = static_cast<size_t>(r * s.cols + col), t = static_cast<size_t>(col * padded + r);
            const bool y_equal = std::memcmp(&yc[i * es], &yg[i * es], es) == 0;
            y_mismatched += !y_equal;
            data_mismatched += dc[i] != dg[i];
            if (y_equal && (dc[i] != dg[i] || tc[t] != tg[t])) ++bytes_where_equal;
          }
        }
        EXPECT_EQ(bytes_where_equal, 0) << "FP8 bytes differ where the LayerNorm outputs agree";
        EXPECT_LE(data_mismatched, y_mismatched);
        for (int64_t col = 0; col < s.cols; ++col) {
          for (int64_t r = s.rows; r < padded; ++r) {
            EXPECT_EQ(tg[static_cast<size_t>(col * padded + r)], 0) << "padding of column " << col;
          }
        }
        const uint32_t start = magnitude_bits(static_cast<float>(kAmaxStart));
        EXPECT_EQ(magnitude_bits(amax_gpu.item<float>()), amax_bits_of(y_gpu, start));
        EXPECT_EQ(magnitude_bits(amax_cpu.item<float>()), amax_bits_of(y_cpu, start));
        if (y_mismatched == 0) {
          EXPECT_TRUE(same_bits(amax_gpu, amax_cpu));
        }
        EXPECT_TRUE(same_bits(g.cast.scale_inv, c.cast.scale_inv));
        EXPECT_LE(relative_error_matching_nans(g.mean, c.mean), 1e-5);
        EXPECT_LE(relative_error_matching_nans(g.rstd, c.rstd), 1e-5);
        if (residual) {
          EXPECT_TRUE(same_bits(g.h, c.h));
        }
      }
    }
  }
}

// The point of the fusion: no tensor of the LayerNorm's output in x's dtype. The device's allocation
// peak during the op stays within its outputs plus a quarter of that tensor (an f32 x here, so the
// tensor would be twice the two FP8 copies).
TEST(CudaLayerNormFp8Memory, NeverAllocatesTheLayerNormOutput) {
  SKIP_WITHOUT_GPU();
  const int64_t rows = 4097, C = 1280;
  for (bool residual : {false, true}) {
    SCOPED_TRACE(residual ? "add_layernorm_fp8_forward" : "layernorm_fp8_forward");
    const Inputs in{random_tensor({rows, C}, DType::f32, 1400, 3.0).to(kGpu),
                    residual ? random_tensor({rows, C}, DType::f32, 1500).to(kGpu) : Tensor(), Tensor(), Tensor()};
    const Tensor scale = full({1}, kScale, DType::f32, kGpu), amax = full({1}, 0.0, DType::f32, kGpu);
    const size_t before = cuda_memory::memory_stats(0).in_use;
    cuda_memory::reset_peak_memory_stats(0);
    const kernels::LayerNormFp8 out = fused(in, scale, amax, DType::e4m3, {true, true}, 16);
    const size_t peak_rise = cuda_memory::memory_stats(0).peak - before;
    size_t outputs = out.cast.data.nbytes() + out.cast.transposed.nbytes() + out.cast.scale_inv.nbytes() +
                     out.mean.nbytes() + out.rstd.nbytes();
    if (residual) outputs += out.h.nbytes();
    const size_t layernorm_output = static_cast<size_t>(rows * C) * sizeof(float);
    EXPECT_LT(peak_rise, outputs + layernorm_output / 4);
  }
}

}  // namespace
}  // namespace octet
