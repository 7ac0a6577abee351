// kernels::keep_mask against the mask drawn on the host the way DropPath drew it before: rand() from
// the same (seed, offset), compared with keep, the value rounded by from_vector. Bit for bit, for every
// element width, and without a host read.
#include "kernels/random_masks.h"

#include <cstring>
#include <vector>

#include "core/host_sync.h"
#include "core/random.h"
#include "tests/testing.h"

namespace {

using namespace octet;
using octet::testing::throws_with;

// The host-drawn mask: rand(shape) < keep ? value : 0, rounded to dtype.
Tensor host_drawn_mask(const Shape& shape, double keep, double value, DType dtype, Generator& gen) {
  std::vector<double> m = rand(shape, gen, DType::f32).to_vector<double>();
  for (double& x : m) x = x < keep ? value : 0.0;
  return from_vector(m, shape, dtype);
}

TEST(KeepMask, IsTheMaskRandWouldDrawBitForBit) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64, DType::e4m3}) {
    for (const Shape& shape : {Shape{1}, Shape{7, 1, 1}, Shape{1000, 1}, Shape{40001}}) {
      for (double p : {0.0, 0.1, 0.5, 0.97}) {
        const double keep = 1.0 - p;
        Generator a(17), b(17);
        a.reserve(5), b.reserve(5);  // a stream already in use
        const Tensor want = host_drawn_mask(shape, keep, 1.0 / keep, dtype, a);
        const host_sync::Counts before = host_sync::counts();
        const uint64_t seed = b.seed(), offset = b.reserve_for(shape.numel());
        const Tensor got = kernels::keep_mask(shape, keep, 1.0 / keep, dtype, Device::cpu(), seed, offset);
        EXPECT_EQ((host_sync::counts() - before).total(), 0);
        EXPECT_EQ(a.offset(), b.offset()) << "both reserve the same blocks";
        ASSERT_EQ(got.shape(), shape);
        ASSERT_EQ(got.dtype(), dtype);
        EXPECT_EQ(std::memcmp(got.data_ptr(), want.data_ptr(), got.nbytes()), 0)
            << dtype_name(dtype) << shape << " p " << p;
      }
    }
  }
}

TEST(KeepMask, KeepsAboutTheRightShareAndChecksItsArguments) {
  const Tensor m = kernels::keep_mask({20000}, 0.75, 2.0, DType::f32, Device::cpu(), 3, 0);
  int64_t kept = 0;
  for (float x : m.to_vector<float>()) {
    ASSERT_TRUE(x == 0.f || x == 2.f);
    kept += x != 0.f;
  }
  EXPECT_NEAR(static_cast<double>(kept) / 20000, 0.75, 0.02);
  EXPECT_EQ(kernels::keep_mask({0, 1}, 0.5, 2.0, DType::f32, Device::cpu(), 3, 0).numel(), 0);
  EXPECT_TRUE(throws_with([] { kernels::keep_mask({2}, 1.5, 1.0, DType::f32, Device::cpu(), 0, 0); },
                          {"keep_mask", "[0, 1]", "1.5"}));
}

}  // namespace
