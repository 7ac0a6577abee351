// The refill (kernels/row_prefetch.h) on the GPU: each kernel that takes it gives the same bits with
// it as without it, on shapes where a warp takes several rows (a block several tiles), the last one
// partial, and where a warp (block) has none to prefetch. That the refill's results are right is the
// other suites' business: it is on unless set, so every LayerNorm backward and FP8 cast test runs it.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <ostream>

#include "kernels/fp8.h"
#include "kernels/nn_ops.h"
#include "kernels/row_prefetch.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/testing.h"

namespace octet {
namespace {

using kernels::GeluApproximation;
using kernels::RowPrefetch;
using testing::kGpu;
using testing::misaligned_on_gpu;
using testing::random_tensor;
using testing::same_bits;

// Refilling launches seen under kRefill by with_and_without_refill: each test below wants some, or
// the switch never reached its kernels and "the same bits either way" compared a kernel with itself.
int64_t refill_launches_seen = 0;

// f() once with each setting, the switch restored after (also when f throws). Under kAfter no
// refilling kernel may run.
template <class F>
auto with_and_without_refill(F f) {
  struct Restore {
    RowPrefetch before = kernels::row_prefetch();
    ~Restore() { kernels::set_row_prefetch(before); }
  } restore;
  kernels::set_row_prefetch(RowPrefetch::kRefill);
  const int64_t at_refill = kernels::row_refill_launches();
  auto refill = f();
  refill_launches_seen += kernels::row_refill_launches() - at_refill;
  kernels::set_row_prefetch(RowPrefetch::kAfter);
  const int64_t at_after = kernels::row_refill_launches();
  auto after = f();
  EXPECT_EQ(kernels::row_refill_launches(), at_after) << "a refilling kernel ran with the switch at kAfter";
  return std::make_pair(refill, after);
}

// First in each test: by its end, some launch under kRefill must have refilled.
struct ExpectSomeRefill {
  ExpectSomeRefill() { refill_launches_seen = 0; }
  ~ExpectSomeRefill() { EXPECT_GT(refill_launches_seen, 0) << "no launch took a refilling kernel under kRefill"; }
};

struct Rows {
  int64_t rows, C;
};

// LayerNorm's backward in the row design, with and without the fused residual gradient and the
// weight: 1 row; 9 rows (fewer than a block's warps); 1000 and ViT-H's 12,608 rows of 1280 (a warp
// refilled 0 and 5 times, the last warps partial); 2000 rows of 640, 4097 of 768 and 40 of 24 (other
// unit counts); 1536 bf16 and 768 f32 (six units a lane: past the refill's five, the kernel without
// it either way). A warp takes more than one row only past one row per resident warp (about 2,100 on
// 132 SMs), so these refill in every dtype: 4097 rows of 640 (f32: five 16-byte units a lane; 16 bits:
// 80 packs, half the lanes without a third unit), of 100 (f32: 25 packs, 7 lanes without one; 16 bits:
// not whole packs, so element loads, and the last unit 4 elements short), and of 640 again with rows
// one element off 16 bytes (element loads throughout).
TEST(CudaRowPrefetch, LayerNormBackwardSameBitsEitherWay) {
  SKIP_WITHOUT_GPU();
  const ExpectSomeRefill expect_some_refill;
  struct Case {
    int64_t rows, C;
    bool misaligned;
  };
  for (DType d : {DType::bf16, DType::f32, DType::f16}) {
    for (Case s : {Case{1, 1280, false}, Case{9, 1280, false}, Case{1000, 1280, false}, Case{12608, 1280, false},
                   Case{4097, 768, false}, Case{2000, 640, false}, Case{40, 24, false}, Case{333, 1536, false},
                   Case{4097, 640, false}, Case{4097, 100, false}, Case{4097, 640, true}}) {
      if (s.rows == 12608 && d != DType::bf16) continue;
      const auto to_gpu = [&](const Tensor& t) { return s.misaligned ? misaligned_on_gpu(t) : t.to(kGpu); };
      for (bool affine : {true, false}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(d) << " rows " << s.rows << " C " << s.C << " affine "
                                          << affine << (s.misaligned ? " misaligned" : ""));
        const uint64_t seed = 500 + static_cast<uint64_t>(s.rows + s.C);
        const Tensor x = to_gpu(random_tensor({s.rows, s.C}, d, seed, 2.0));
        const Tensor dy = to_gpu(random_tensor({s.rows, s.C}, d, seed + 1));
        const Tensor dres = to_gpu(random_tensor({s.rows, s.C}, d, seed + 2));
        const Tensor w = affine ? random_tensor({s.C}, d, seed + 3).to(kGpu) : Tensor();
        const Tensor b = affine ? random_tensor({s.C}, d, seed + 4).to(kGpu) : Tensor();
        const auto fwd = kernels::layernorm_forward(x, w, b, 1e-6);
        const auto [refill, after] =
            with_and_without_refill([&] { return kernels::layernorm_backward(dy, x, w, fwd.mean, fwd.rstd); });
        EXPECT_TRUE(same_bits(refill.dx, after.dx));
        const auto [fused_refill, fused_after] = with_and_without_refill(
            [&] { return kernels::add_layernorm_backward(dy, dres, x, w, fwd.mean, fwd.rstd); });
        EXPECT_TRUE(same_bits(fused_refill.dh, fused_after.dh));
        if (affine) {
          EXPECT_TRUE(same_bits(refill.dweight, after.dweight));
          EXPECT_TRUE(same_bits(refill.dbias, after.dbias));
          EXPECT_TRUE(same_bits(fused_refill.dweight, fused_after.dweight));
          EXPECT_TRUE(same_bits(fused_refill.dbias, fused_after.dbias));
        }
      }
    }
  }
}

// Everything a cast writes: the bytes, the transposed copy and its padding, the amax (from a slot
// that starts non-zero) and scale_inv, and dbias where there is one.
void expect_same_cast(const kernels::Fp8Cast& got, const kernels::Fp8Cast& want) {
  EXPECT_EQ(got.data.defined(), want.data.defined());
  if (got.data.defined()) {
    EXPECT_TRUE(same_bits(got.data, want.data)) << "row-major copy";
  }
  EXPECT_EQ(got.transposed.defined(), want.transposed.defined());
  if (got.transposed.defined()) {
    EXPECT_TRUE(same_bits(got.transposed, want.transposed)) << "transposed copy";
  }
  EXPECT_TRUE(same_bits(got.scale_inv, want.scale_inv)) << "scale_inv";
}

struct CastRun {
  kernels::Fp8CastWithBiasGrad cast;
  Tensor amax;
};

// The tiled casts (fp8_cast, fp8_cast_dbias, gelu_fp8_forward, dgelu_fp8_cast_dbias): ViT-H's fc1
// output (12,608 x 5120: 15,760 tiles, several a block), 4097 x 1000 (partial tiles down and across),
// 100 x 64 (two tiles: a block with none to prefetch) and 3 x 8; bf16 and f32 inputs.
TEST(CudaRowPrefetch, TiledFp8CastsSameBytesEitherWay) {
  SKIP_WITHOUT_GPU();
  const ExpectSomeRefill expect_some_refill;
  for (DType d : {DType::bf16, DType::f32}) {
    for (Rows s : {Rows{12608, 5120}, Rows{4097, 1000}, Rows{100, 64}, Rows{3, 8}}) {
      if (s.rows == 12608 && d != DType::bf16) continue;
      SCOPED_TRACE(::testing::Message() << dtype_name(d) << " " << s.rows << " x " << s.C);
      const uint64_t seed = 900 + static_cast<uint64_t>(s.rows + s.C);
      const Tensor x = random_tensor({s.rows, s.C}, d, seed, 3.0).to(kGpu);
      const Tensor dact = random_tensor({s.rows, s.C}, d, seed + 1).to(kGpu);
      const Tensor scale = full({1}, 37.5, DType::f32, kGpu);
      // run(f): f(amax slot) with a fresh slot at 0.25, and the slot after.
      auto run = [&](auto f) {
        return with_and_without_refill([&] {
          const Tensor amax = full({1}, 0.25, DType::f32, kGpu);
          return CastRun{f(amax), amax};
        });
      };
      auto as_dbias = [](kernels::Fp8Cast c) {
        kernels::Fp8CastWithBiasGrad out;
        static_cast<kernels::Fp8Cast&>(out) = c;
        return out;
      };
      const auto cast = run([&](const Tensor& amax) {
        return as_dbias(kernels::fp8_cast(x, scale, amax, DType::e4m3, true, true));
      });
      const auto cast_dbias = run([&](const Tensor& amax) {
        return kernels::fp8_cast_dbias(x, scale, amax, DType::e5m2, true, true, DType::bf16);
      });
      const auto transposed_only = run([&](const Tensor& amax) {
        return as_dbias(kernels::fp8_cast(x, scale, amax, DType::e4m3, false, true));
      });
      const auto gelu = run([&](const Tensor& amax) {
        return as_dbias(kernels::gelu_fp8_forward(x, GeluApproximation::None, scale, amax, DType::e4m3, true, true));
      });
      const auto dgelu = run([&](const Tensor& amax) {
        return kernels::dgelu_fp8_cast_dbias(dact, x, GeluApproximation::None, scale, amax, DType::e5m2, true, true,
                                             DType::bf16);
      });
      for (const auto* p : {&cast, &cast_dbias, &transposed_only, &gelu, &dgelu}) {
        expect_same_cast(p->first.cast, p->second.cast);
        EXPECT_TRUE(same_bits(p->first.amax, p->second.amax)) << "amax";
      }
      EXPECT_TRUE(same_bits(cast_dbias.first.cast.dbias, cast_dbias.second.cast.dbias)) << "dbias";
      EXPECT_TRUE(same_bits(dgelu.first.cast.dbias, dgelu.second.cast.dbias)) << "dgelu's dbias";
    }
  }
}

struct LayerNormFp8Run {
  kernels::LayerNormFp8 out;
  Tensor amax;
};

// LayerNorm writing FP8, with and without the residual add, both copies and the row-major one alone:
// ViT-H's 12,608 rows of 1280 (several rows a warp, several tiles a block with the residual), 4097
// rows (the last tile partial: its warps' next rows are the transposed copy's padding), 33 rows of
// 1280 and 5 of 96, 1000 f32 rows of 512.
TEST(CudaRowPrefetch, LayerNormFp8SameBytesEitherWay) {
  SKIP_WITHOUT_GPU();
  const ExpectSomeRefill expect_some_refill;
  struct Case {
    DType d;
    Rows s;
  };
  for (Case k : {Case{DType::bf16, {12608, 1280}}, Case{DType::bf16, {4097, 1280}}, Case{DType::bf16, {33, 1280}},
                 Case{DType::bf16, {5, 96}}, Case{DType::f32, {1000, 512}}}) {
    for (bool residual : {false, true}) {
      for (bool rowwise_only : {false, true}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(k.d) << " " << k.s.rows << " x " << k.s.C << " residual "
                                          << residual << " row-major only " << rowwise_only);
        const uint64_t seed = 1300 + static_cast<uint64_t>(k.s.rows + k.s.C);
        const Tensor x = random_tensor({k.s.rows, k.s.C}, k.d, seed, 2.0).to(kGpu);
        const Tensor y = random_tensor({k.s.rows, k.s.C}, k.d, seed + 1).to(kGpu);
        const Tensor w = random_tensor({k.s.C}, k.d, seed + 2).to(kGpu);
        const Tensor b = random_tensor({k.s.C}, k.d, seed + 3).to(kGpu);
        const Tensor scale = full({1}, 60.0, DType::f32, kGpu);
        const auto [refill, after] = with_and_without_refill([&] {
          const Tensor amax = full({1}, 0.25, DType::f32, kGpu);
          const bool transposed = !rowwise_only;
          if (residual) {
            return LayerNormFp8Run{
                kernels::add_layernorm_fp8_forward(x, y, w, b, 1e-6, scale, amax, DType::e4m3, true, transposed), amax};
          }
          return LayerNormFp8Run{
              kernels::layernorm_fp8_forward(x, w, b, 1e-6, scale, amax, DType::e4m3, true, transposed), amax};
        });
        expect_same_cast(refill.out.cast, after.out.cast);
        EXPECT_TRUE(same_bits(refill.amax, after.amax)) << "amax";
        EXPECT_TRUE(same_bits(refill.out.mean, after.out.mean)) << "mean";
        EXPECT_TRUE(same_bits(refill.out.rstd, after.out.rstd)) << "rstd";
        if (residual) {
          EXPECT_TRUE(same_bits(refill.out.h, after.out.h)) << "h";
        }
      }
    }
  }
}

}  // namespace
}  // namespace octet
