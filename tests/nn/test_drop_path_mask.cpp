// DropPath draws its mask on the input's device (kernels::keep_mask) with the draws it took before on
// the host: the same generator offsets and the same output, bit for bit, and no host read in forward
// or backward.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "autograd/ops.h"
#include "core/host_sync.h"
#include "core/random.h"
#include "nn/layers.h"
#include "tests/testing.h"

namespace octet {
namespace {

TEST(DropPathMask, SameOutputAsTheHostDrawnMaskAndNoHostRead) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
    const double p = 0.3;
    Generator gen(11), reference(11);
    nn::DropPath drop_path(p, &gen);
    Tensor x = testing::random_tensor({9, 5, 4}, dtype, 12);
    x.requires_grad_();

    const host_sync::Counts before = host_sync::counts();
    const Tensor y = drop_path(x);
    sum(y).backward();
    EXPECT_EQ((host_sync::counts() - before).total(), 0) << (host_sync::counts() - before).describe();

    // The mask as DropPath drew it before: rand() on the host, compared with keep, copied to x's device.
    const double keep = 1.0 - p;
    std::vector<double> mask = rand({9, 1, 1}, reference, DType::f32).to_vector<double>();
    for (double& m : mask) m = m < keep ? 1.0 / keep : 0.0;
    const Tensor want = mul(x.detach(), from_vector(mask, {9, 1, 1}, dtype));
    EXPECT_EQ(gen.offset(), reference.offset());
    ASSERT_EQ(y.dtype(), want.dtype());
    EXPECT_EQ(std::memcmp(y.detach().data_ptr(), want.data_ptr(), want.nbytes()), 0) << dtype_name(dtype);
  }
}

}  // namespace
}  // namespace octet
