// The CUDA FP8 kernels against the CPU kernels on the same inputs. Both compute every byte and every
// scale with the same host/device code (core/float_formats.h, kernels/fp8_scale_rule.h) and amax is an
// exact maximum, so every comparison here is bit for bit (same_bits), NaN payloads included. The one
// exception is the bias gradient of fp8_cast_dbias, an f32 sum that the GPU adds in another order: it is
// held to the bound derived at expect_same_cast_dbias.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <ostream>
#include <vector>

#include "kernels/fp8.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/cuda/fp8_cast_testing.h"
#include "tests/kernels/fp8_cast_case.h"
#include "tests/testing.h"

namespace octet {
namespace {

using kernels::AmaxCompute;
using kernels::Fp8ScalingTensors;
using testing::kGpu;
using testing::misaligned_on_gpu;
using testing::random_tensor;
using testing::same_bits;
using testing::uniform_tensor;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Standard-normal values times `spread`, with a few spikes far beyond the FP8 range (they saturate).
Tensor spiky_input(const Shape& shape, DType dtype, uint64_t seed, double spread) {
  Tensor x = random_tensor(shape, DType::f32, seed, spread);
  float* p = x.data<float>();
  for (int64_t i = 0; i < x.numel(); i += 997) p[i] = (i % 2 ? -1.f : 1.f) * 1e6f;
  return x.to(dtype);
}

using octet::testing::CastCase;

// Casts x on both devices (amax starting from the same non-zero value) and compares everything. x_gpu:
// x on the GPU, x_cpu.to(kGpu) when undefined (a view at some offset, to take the scalar paths).
void expect_same_cast(const Tensor& x_cpu, DType format, bool rowwise, bool transposed, int64_t pad_rows_to,
                      const Tensor& x_gpu = Tensor()) {
  const Tensor scale = full({1}, 37.0);
  const Tensor amax_cpu = full({1}, 0.75), amax_gpu = amax_cpu.to(kGpu);
  const auto cpu = kernels::fp8_cast(x_cpu, scale, amax_cpu, format, rowwise, transposed, pad_rows_to);
  const auto gpu = kernels::fp8_cast(x_gpu.defined() ? x_gpu : x_cpu.to(kGpu), scale.to(kGpu), amax_gpu, format,
                                     rowwise, transposed, pad_rows_to);
  EXPECT_EQ(gpu.data.defined(), rowwise);
  EXPECT_EQ(gpu.transposed.defined(), transposed);
  if (rowwise) {
    EXPECT_TRUE(gpu.data.is_cuda());
    EXPECT_TRUE(same_bits(gpu.data, cpu.data)) << "row-major copy";
  }
  if (transposed) {
    EXPECT_TRUE(same_bits(gpu.transposed, cpu.transposed)) << "transposed copy";
  }
  EXPECT_TRUE(same_bits(gpu.scale_inv, cpu.scale_inv)) << "scale_inv";
  EXPECT_TRUE(same_bits(amax_gpu, amax_cpu)) << "amax";
}

class CudaFp8CastKernel : public ::testing::TestWithParam<CastCase> {};

TEST_P(CudaFp8CastKernel, MatchesTheCpuBitForBit) {
  SKIP_WITHOUT_GPU();
  const CastCase c = GetParam();
  const Tensor x = spiky_input(c.shape, c.input, 40 + c.shape.numel(), 3.0);
  expect_same_cast(x, c.format, true, true, c.pad_rows_to);
  expect_same_cast(x, c.format, true, false, c.pad_rows_to);
  expect_same_cast(x, c.format, false, true, c.pad_rows_to);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaFp8CastKernel,
                         ::testing::Values(CastCase{{1000, 768}, DType::bf16, DType::e4m3, 16},
                                           CastCase{{1000, 768}, DType::f32, DType::e5m2, 16},
                                           CastCase{{197, 3072}, DType::bf16, DType::e5m2, 16},
                                           CastCase{{197, 3072}, DType::f32, DType::e4m3, 16},
                                           CastCase{{4, 197, 96}, DType::bf16, DType::e4m3, 16},
                                           CastCase{{37, 53}, DType::f32, DType::e4m3, 16},
                                           CastCase{{37, 53}, DType::bf16, DType::e5m2, 1},
                                           CastCase{{1, 17}, DType::bf16, DType::e4m3, 16},
                                           CastCase{{129, 16}, DType::f32, DType::e4m3, 7},
                                           CastCase{{65, 1}, DType::bf16, DType::e5m2, 16},
                                           CastCase{{3, 5, 7}, DType::f16, DType::e4m3, 16},
                                           CastCase{{130, 130}, DType::f16, DType::e5m2, 3},
                                           CastCase{{0, 64}, DType::bf16, DType::e4m3, 16},
                                           // The 16-byte path (cols % 8 == 0): rows under one tile, a
                                           // partial column tile, f16 and f32 inputs, a transposed copy
                                           // padded by a whole extra chunk of zero rows (pad 64), and
                                           // one whose rows are not a multiple of 16 bytes (byte stores).
                                           CastCase{{5, 64}, DType::bf16, DType::e5m2, 16},
                                           CastCase{{1, 8}, DType::bf16, DType::e4m3, 16},
                                           CastCase{{33, 24}, DType::f32, DType::e5m2, 16},
                                           CastCase{{64, 8}, DType::f16, DType::e4m3, 16},
                                           CastCase{{70, 136}, DType::bf16, DType::e4m3, 64},
                                           CastCase{{70, 72}, DType::f32, DType::e4m3, 8},
                                           CastCase{{200, 200}, DType::bf16, DType::e5m2, 48},
                                           // cols % 8 == 4: the scalar path with a 4-aligned width.
                                           CastCase{{100, 36}, DType::bf16, DType::e4m3, 16},
                                           // ViT-H at batch 64 (12,608 tokens): activations, the MLP's
                                           // hidden width, and the weights.
                                           CastCase{{12608, 1280}, DType::bf16, DType::e4m3, 16},
                                           CastCase{{12608, 5120}, DType::bf16, DType::e5m2, 16},
                                           CastCase{{3840, 1280}, DType::bf16, DType::e4m3, 16},
                                           CastCase{{1280, 5120}, DType::bf16, DType::e4m3, 16},
                                           // Blocks that take several tiles, the last ones partial
                                           // down (4097 = 64 · 64 + 1 rows) and across (1000 = 15 · 64
                                           // + 40 columns): 1040 tiles, where at 80 registers (6
                                           // blocks an SM) an H200 runs 792 blocks. The ViT-H shapes
                                           // above take several a block too, but whole tiles only.
                                           CastCase{{4097, 1000}, DType::bf16, DType::e4m3, 16},
                                           CastCase{{4097, 1000}, DType::f32, DType::e5m2, 16}));

// An input that starts one element into its storage: the GPU takes its unaligned (scalar) path.
TEST(CudaFp8Cast, UnalignedInputMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  for (DType d : {DType::f32, DType::bf16}) {
    const Tensor storage = spiky_input({1 + 96 * 64}, d, 77, 4.0);
    const Tensor x = storage.narrow(1, 96 * 64).reshape({96, 64});
    expect_same_cast(x, DType::e4m3, true, true, 16);
  }
}

// Inputs 8 bytes past a 16-byte boundary (4 bf16 or 2 f32 elements): aligned enough for 8-byte
// accesses but not for the 16-byte path, whose width (cols % 8 == 0) they would otherwise take; with
// each combination of copies and the transposed copy at two paddings.
TEST(CudaFp8Cast, InputsOffByEightBytesMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  for (DType d : {DType::bf16, DType::f32}) {
    const int64_t offset = static_cast<int64_t>(8 / dtype_size(d));
    for (const Shape& shape : {Shape{96, 64}, Shape{130, 200}, Shape{12608, 1280}}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(d) << " " << shape);
      const Tensor x = spiky_input(shape, d, 78 + shape.numel(), 4.0);
      const Tensor x_gpu = misaligned_on_gpu(x, offset);
      for (int64_t pad : {int64_t{16}, int64_t{5}}) {
        expect_same_cast(x, DType::e4m3, true, true, pad, x_gpu);
        expect_same_cast(x, DType::e5m2, true, false, pad, x_gpu);
        expect_same_cast(x, DType::e4m3, false, true, pad, x_gpu);
      }
    }
  }
}

// Casts without an amax (a weight's under current scaling, whose amax is its own fp8_amax_ pass): the
// same bytes and scale_inv, on the 16-byte path and the scalar one.
TEST(CudaFp8Cast, WithoutAmaxMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  for (const Shape& shape : {Shape{1280, 1280}, Shape{5120, 1280}, Shape{37, 53}}) {
    SCOPED_TRACE(::testing::Message() << shape);
    const Tensor x = spiky_input(shape, DType::bf16, 79 + shape.numel(), 2.0);
    const Tensor scale = full({1}, 11.0);
    const auto cpu = kernels::fp8_cast(x, scale, Tensor(), DType::e4m3, true, true);
    const auto gpu = kernels::fp8_cast(x.to(kGpu), scale.to(kGpu), Tensor(), DType::e4m3, true, true);
    EXPECT_TRUE(same_bits(gpu.data, cpu.data)) << "row-major copy";
    EXPECT_TRUE(same_bits(gpu.transposed, cpu.transposed)) << "transposed copy";
    EXPECT_TRUE(same_bits(gpu.scale_inv, cpu.scale_inv)) << "scale_inv";
  }
}

TEST(CudaFp8Cast, NaNAndInfMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  for (DType d : {DType::f32, DType::bf16}) {
    Tensor x = random_tensor({70, 90}, DType::f32, 5);
    x.data<float>()[123] = -kInf;
    expect_same_cast(x.to(d), DType::e5m2, true, true, 16);
    x.data<float>()[4000] = kNaN;
    expect_same_cast(x.to(d), DType::e4m3, true, true, 16);
  }
}

// ---- the cast fused with the bias gradient ------------------------------------------------------------------

// Unit roundoff of a rounding to d (0 for f32, which the sums already are).
double unit_roundoff(DType d) {
  if (d == DType::bf16) return std::ldexp(1.0, -8);
  if (d == DType::f16) return std::ldexp(1.0, -11);
  return 0.0;
}

// fp8_cast_dbias on both devices. The FP8 bytes, scale_inv and amax are the same bits (the GPU's also
// equal its own fp8_cast's). dbias is summed in f32 in a different order on each device: any order of
// n additions is within (n-1)·u·Σ|x| of the exact sum (u = 2^-24), so the two f32 sums of column c are
// within e_c = 2·rows·u·S_c of each other, S_c = Σ_r |x[r, c]|. Each is then rounded to x's dtype and to
// dbias_dtype, relative roundoff u_out = u(x dtype) + u(dbias dtype) at most (for normal values), so
//   |dbias_gpu[c] - dbias_cpu[c]| <= e_c + u_out·(|f32 sum_gpu| + |f32 sum_cpu|)
//                                 <= e_c·(1 + u_out) + 2·u_out·(|dbias_cpu[c]|·(1 + 2·u_out) + e_c),
// and a GPU run repeated gives the same bits (no float atomics).
void expect_same_cast_dbias(const Tensor& x_cpu, DType format, bool rowwise, bool transposed, DType dbias_dtype,
                            int64_t pad_rows_to = kernels::kFp8RowPadding, const Tensor& x_on_gpu = Tensor()) {
  const Tensor scale = full({1}, 37.0);
  const Tensor amax_cpu = full({1}, 0.75), amax_gpu = amax_cpu.to(kGpu), amax_plain = amax_cpu.to(kGpu);
  const Tensor x_gpu = x_on_gpu.defined() ? x_on_gpu : x_cpu.to(kGpu);
  const auto cpu =
      kernels::fp8_cast_dbias(x_cpu, scale, amax_cpu, format, rowwise, transposed, dbias_dtype, pad_rows_to);
  const auto gpu = kernels::fp8_cast_dbias(x_gpu, scale.to(kGpu), amax_gpu, format, rowwise, transposed,
                                           dbias_dtype, pad_rows_to);
  const auto plain = kernels::fp8_cast(x_gpu, scale.to(kGpu), amax_plain, format, rowwise, transposed, pad_rows_to);
  ASSERT_EQ(gpu.data.defined(), rowwise);
  ASSERT_EQ(gpu.transposed.defined(), transposed);
  if (rowwise) {
    EXPECT_TRUE(same_bits(gpu.data, cpu.data)) << "row-major copy";
    EXPECT_TRUE(same_bits(gpu.data, plain.data)) << "row-major copy against the GPU's fp8_cast";
  }
  if (transposed) {
    EXPECT_TRUE(same_bits(gpu.transposed, cpu.transposed)) << "transposed copy";
    EXPECT_TRUE(same_bits(gpu.transposed, plain.transposed)) << "transposed copy against the GPU's fp8_cast";
  }
  EXPECT_TRUE(same_bits(gpu.scale_inv, cpu.scale_inv)) << "scale_inv";
  EXPECT_TRUE(same_bits(amax_gpu, amax_cpu)) << "amax";

  ASSERT_TRUE(gpu.dbias.is_cuda());
  ASSERT_EQ(gpu.dbias.dtype(), dbias_dtype);
  ASSERT_EQ(gpu.dbias.shape(), cpu.dbias.shape());
  const int64_t cols = x_cpu.dim() == 0 ? 1 : x_cpu.size(-1), rows = cols == 0 ? 0 : x_cpu.numel() / cols;
  const std::vector<double> xs = x_cpu.to_vector<double>();
  const std::vector<double> want = cpu.dbias.to_vector<double>(), got = gpu.dbias.to(Device::cpu()).to_vector<double>();
  const double u = std::ldexp(1.0, -24), u_out = unit_roundoff(x_cpu.dtype()) + unit_roundoff(dbias_dtype);
  for (int64_t c = 0; c < cols; ++c) {
    double abs_sum = 0;
    for (int64_t r = 0; r < rows; ++r) abs_sum += std::abs(xs[r * cols + c]);
    const double e = 2.0 * static_cast<double>(rows) * u * abs_sum;
    const double bound = e * (1 + u_out) + 2 * u_out * (std::abs(want[c]) * (1 + 2 * u_out) + e);
    EXPECT_LE(std::abs(got[c] - want[c]), bound) << "dbias[" << c << "]: gpu " << got[c] << ", cpu " << want[c];
  }
  const auto again = kernels::fp8_cast_dbias(x_gpu, scale.to(kGpu), Tensor(), format, rowwise, transposed,
                                             dbias_dtype, pad_rows_to);
  EXPECT_TRUE(same_bits(again.dbias, gpu.dbias)) << "a repeated run gives the same dbias";
}

struct DbiasCase {
  Shape shape;
  DType input, format, dbias;
};

void PrintTo(const DbiasCase& c, std::ostream* os) {
  *os << c.shape << " " << dtype_name(c.input) << " -> " << dtype_name(c.format) << ", dbias "
      << dtype_name(c.dbias);
}

class CudaFp8CastDbias : public ::testing::TestWithParam<DbiasCase> {};

TEST_P(CudaFp8CastDbias, MatchesTheCpuBitForBitAndDbiasWithinTheBound) {
  SKIP_WITHOUT_GPU();
  const DbiasCase c = GetParam();
  const Tensor x = random_tensor(c.shape, c.input, 60 + c.shape.numel(), 3.0);
  expect_same_cast_dbias(x, c.format, true, true, c.dbias);
  expect_same_cast_dbias(x, c.format, true, false, c.dbias);
  expect_same_cast_dbias(x, c.format, false, true, c.dbias);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaFp8CastDbias,
                         ::testing::Values(DbiasCase{{1000, 768}, DType::bf16, DType::e5m2, DType::bf16},
                                           DbiasCase{{1000, 768}, DType::f32, DType::e5m2, DType::f32},
                                           DbiasCase{{4, 197, 3072}, DType::bf16, DType::e5m2, DType::bf16},
                                           DbiasCase{{130, 144}, DType::bf16, DType::e4m3, DType::f32},
                                           DbiasCase{{33, 48}, DType::f32, DType::e4m3, DType::bf16},
                                           DbiasCase{{7, 32}, DType::f16, DType::e5m2, DType::f16},
                                           DbiasCase{{1, 16}, DType::bf16, DType::e5m2, DType::bf16},
                                           DbiasCase{{37, 53}, DType::f32, DType::e5m2, DType::f32},
                                           DbiasCase{{0, 64}, DType::bf16, DType::e5m2, DType::bf16},
                                           // Rows under one tile, cols % 8 == 4 (the scalar path), a
                                           // partial column tile of the 16-byte path, and ViT-H's
                                           // output gradients at batch 64.
                                           DbiasCase{{5, 64}, DType::bf16, DType::e5m2, DType::bf16},
                                           DbiasCase{{100, 36}, DType::bf16, DType::e5m2, DType::f32},
                                           DbiasCase{{300, 72}, DType::f32, DType::e5m2, DType::f32},
                                           DbiasCase{{12608, 1280}, DType::bf16, DType::e5m2, DType::bf16},
                                           // Several tiles a block, partial down and across (as in
                                           // CudaFp8CastKernel above).
                                           DbiasCase{{4097, 1000}, DType::bf16, DType::e5m2, DType::bf16},
                                           DbiasCase{{4097, 1000}, DType::f32, DType::e5m2, DType::f32}));

// Spikes that saturate, NaN and inf, an input one element into its storage (the scalar path) and
// padding to 7 rows and none.
TEST(CudaFp8CastDbias, SpikesUnalignedInputAndOtherPaddingsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  for (DType d : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(d));
    expect_same_cast_dbias(spiky_input({300, 96}, d, 81, 3.0), DType::e5m2, true, true, d, 7);
    expect_same_cast_dbias(spiky_input({300, 96}, d, 82, 3.0), DType::e4m3, false, true, d, 1);
    const Tensor storage = spiky_input({1 + 96 * 64}, d, 83, 4.0);
    expect_same_cast_dbias(storage.narrow(1, 96 * 64).reshape({96, 64}), DType::e5m2, true, true, d);
    // 8 bytes past a 16-byte boundary (the scalar path at a width the 16-byte path takes), and padding
    // 60 rows to 128: the second row tile holds only padding, whose column partials must be zeros.
    const Tensor x = spiky_input({130, 96}, d, 85, 3.0);
    expect_same_cast_dbias(x, DType::e5m2, true, true, d, 16,
                           misaligned_on_gpu(x, static_cast<int64_t>(8 / dtype_size(d))));
    expect_same_cast_dbias(spiky_input({60, 96}, d, 86, 3.0), DType::e5m2, true, true, d, 128);
  }
  Tensor x = random_tensor({70, 96}, DType::f32, 84);
  x.data<float>()[123] = -kInf;
  const auto cpu = kernels::fp8_cast_dbias(x, full({1}, 1.0), Tensor(), DType::e5m2, true, true, DType::f32);
  const auto gpu = kernels::fp8_cast_dbias(x.to(kGpu), full({1}, 1.0).to(kGpu), Tensor(), DType::e5m2, true, true,
                                           DType::f32);
  EXPECT_TRUE(same_bits(gpu.data, cpu.data));
  const std::vector<float> db = gpu.dbias.to(Device::cpu()).to_vector<float>();
  for (int64_t c = 0; c < 96; ++c) {
    if (c == 123 % 96) {
      EXPECT_EQ(db[c], -kInf) << "the column holding -inf";
    } else {
      EXPECT_TRUE(std::isfinite(db[c])) << "column " << c;
    }
  }
  EXPECT_EQ(cpu.dbias.to_vector<float>()[123 % 96], -kInf);
}

TEST(CudaFp8Amax, MatchesTheCpuForEveryInputDtype) {
  SKIP_WITHOUT_GPU();
  for (DType d : {DType::f32, DType::bf16, DType::f16}) {
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{100003}, (int64_t{1} << 22) + 3}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(d) << ", n " << n);
      const Tensor storage = random_tensor({n + 1}, d, 90 + n, 2.0);
      for (const Tensor& x : {storage.narrow(0, n), storage.narrow(1, n)}) {  // aligned, then not
        const Tensor amax_cpu = zeros({1}), amax_gpu = zeros({1}, DType::f32, kGpu);
        kernels::fp8_amax_(x, amax_cpu);
        kernels::fp8_amax_(x.to(kGpu), amax_gpu);
        EXPECT_TRUE(same_bits(amax_gpu, amax_cpu));
        EXPECT_GT(amax_cpu.item(), 0.0);
      }
    }
  }
}

// ---- scale updates --------------------------------------------------------------------------------------

struct GroupPair {
  std::vector<Fp8ScalingTensors> cpu, gpu;
};

Fp8ScalingTensors to_gpu(const Fp8ScalingTensors& g) {
  return {g.amax_history.to(kGpu), g.scale.to(kGpu), g.scale_inv.to(kGpu), g.fp8_dtype};
}

// 150 groups (three launches of at most 64), of history lengths 1 to 1024 and widths 1 to 1500 (more
// columns than one launch has blocks across), alternating formats; some columns hold amax 0, NaN,
// inf or a denormal.
GroupPair many_groups() {
  GroupPair pair;
  const std::vector<int64_t> lengths = {1, 4, 17, 1024, 2};
  const std::vector<int64_t> widths = {1, 2, 3, 300, 1500, 2};
  for (int i = 0; i < 150; ++i) {
    const int64_t L = lengths[i % lengths.size()], n = widths[i % widths.size()];
    Tensor history = uniform_tensor({L, n}, 1e-3, 300.0, DType::f32, 500 + i);
    float* h = history.data<float>();
    if (n >= 3 && (i / 6) % 2 == 0) {
      for (int64_t r = 0; r < L; ++r) h[r * n] = 0.f;  // column 0: amax 0
      h[(L - 1) * n + 1] = kNaN;                       // column 1: NaN in the oldest row
      h[2] = (i / 12) % 2 ? kInf : 1e-40f;             // column 2: inf or a denormal in row 0
    }
    const Tensor scale = uniform_tensor({n}, 0.5, 4.0, DType::f32, 900 + i);
    Fp8ScalingTensors g{history, scale, zeros({n}), i % 2 ? DType::e5m2 : DType::e4m3};
    pair.cpu.push_back(g);
    pair.gpu.push_back(to_gpu(g));
  }
  return pair;
}

void expect_same_groups(const GroupPair& pair) {
  for (size_t i = 0; i < pair.cpu.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "group " << i);
    EXPECT_TRUE(same_bits(pair.gpu[i].amax_history, pair.cpu[i].amax_history)) << "history";
    EXPECT_TRUE(same_bits(pair.gpu[i].scale, pair.cpu[i].scale)) << "scale";
    EXPECT_TRUE(same_bits(pair.gpu[i].scale_inv, pair.cpu[i].scale_inv)) << "scale_inv";
  }
}

TEST(CudaFp8UpdateScales, ManyGroupsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  for (AmaxCompute algo : {AmaxCompute::Max, AmaxCompute::MostRecent}) {
    SCOPED_TRACE(algo == AmaxCompute::Max ? "max" : "most recent");
    GroupPair pair = many_groups();
    for (int step = 0; step < 3; ++step) {
      const double margin = step == 1 ? 0.5 : 0.0;
      kernels::fp8_update_scales_(pair.cpu, margin, algo);
      kernels::fp8_update_scales_(pair.gpu, margin, algo);
      expect_same_groups(pair);
      // The next step's amaxes arrive in row 0.
      for (size_t i = 0; i < pair.cpu.size(); ++i) {
        const int64_t n = pair.cpu[i].amax_history.size(1);
        const Tensor head = uniform_tensor({n}, 0.01, 50.0, DType::f32, 2000 + 10 * i + step);
        pair.cpu[i].amax_history.select(0).copy_(head);
        pair.gpu[i].amax_history.select(0).copy_(head);
      }
    }
  }
}

TEST(CudaFp8ScaleFromAmax, MatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  Tensor amax = uniform_tensor({5000}, 1e-3, 1e4, DType::f32, 31);
  float* a = amax.data<float>();
  a[0] = 0.f;
  a[1] = kNaN;
  a[2] = kInf;
  a[3] = 1e-40f;
  for (DType format : {DType::e4m3, DType::e5m2}) {
    const Tensor scale_cpu = uniform_tensor({5000}, 0.5, 4.0, DType::f32, 32), scale_inv_cpu = zeros({5000});
    const Tensor scale_gpu = scale_cpu.to(kGpu), scale_inv_gpu = scale_inv_cpu.to(kGpu);
    kernels::fp8_scale_from_amax_(amax, scale_cpu, scale_inv_cpu, format, 1.0);
    kernels::fp8_scale_from_amax_(amax.to(kGpu), scale_gpu, scale_inv_gpu, format, 1.0);
    EXPECT_TRUE(same_bits(scale_gpu, scale_cpu)) << dtype_name(format);
    EXPECT_TRUE(same_bits(scale_inv_gpu, scale_inv_cpu)) << dtype_name(format);
  }
}

}  // namespace
}  // namespace octet
