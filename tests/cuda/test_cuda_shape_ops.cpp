// CUDA data movement against the CPU kernels. Moving elements must not change them, so results are
// compared bit for bit in every dtype; index_select_backward adds in the same order as the CPU and
// is bit-exact in f32 too (bf16 is compared by norm-wise relative error, at most 1e-2).
#include <gtest/gtest.h>

#include <vector>

#include "kernels/shape_ops.h"
#include "tests/testing.h"
#include "tests/cuda/cuda_testing.h"

namespace octet {
namespace {

using testing::kGpu;
using testing::random_tensor;
using testing::same_bits;
using testing::throws_with;

const std::vector<DType> kDtypes = {DType::f32, DType::bf16, DType::u8, DType::f64};

// A random tensor of any dtype (integers from scaled normals).
Tensor random_any(const Shape& shape, DType dtype, uint64_t seed) {
  return random_tensor(shape, DType::f64, seed, is_floating(dtype) ? 1.0 : 100.0).to(dtype);
}

TEST(CudaShapeOps, PermuteEveryPatternAndDtype) {
  SKIP_WITHOUT_GPU();
  struct Case {
    Shape shape;
    std::vector<int64_t> dims;
  };
  const std::vector<Case> cases = {
      {{7, 13, 33}, {0, 1, 2}},  {{7, 13, 33}, {2, 1, 0}},  {{7, 13, 33}, {1, 0, 2}},
      {{7, 13, 33}, {0, 2, 1}},  {{7, 13, 33}, {2, 0, 1}},  {{1}, {0}},
      {{2, 17, 3, 4, 16}, {2, 0, 3, 1, 4}},   // the ViT's qkv split: [B, S, 3, H, D] -> [3, B, H, S, D]
      {{2, 4, 17, 16}, {0, 2, 1, 3}},         // heads merged back: [B, H, S, D] -> [B, S, H, D]
      {{2, 4, 17, 10}, {0, 2, 1, 3}},         // a run of 10 elements: narrower units
      {{3, 1, 5, 1, 7}, {4, 3, 2, 1, 0}},     // size-1 dims dropped
      {{65, 67}, {1, 0}}};                    // several transpose tiles with ragged edges
  for (DType dtype : kDtypes) {
    for (const Case& c : cases) {
      const Tensor x = random_any(c.shape, dtype, 31);
      EXPECT_TRUE(same_bits(kernels::permute(x.to(kGpu), c.dims), kernels::permute(x, c.dims))) << x.describe();
    }
  }
  // An input view one element into its storage (misaligned for wide units).
  const Tensor flat = random_any({1 + 2 * 4 * 17 * 16}, DType::bf16, 32);
  const Tensor view = flat.narrow(1, 2 * 4 * 17 * 16).reshape({2, 4, 17, 16});
  EXPECT_TRUE(same_bits(kernels::permute(flat.to(kGpu).narrow(1, 2 * 4 * 17 * 16).reshape({2, 4, 17, 16}), {0, 2, 1, 3}),
                        kernels::permute(view, {0, 2, 1, 3})));
}

TEST(CudaShapeOps, TransposeLast2) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::f32, DType::bf16, DType::i64, DType::e4m3}) {
    for (const Shape& shape : {Shape{3, 37, 45}, Shape{1, 1}, Shape{64, 1}, Shape{2, 5, 129, 33}}) {
      const Tensor x = random_any(shape, dtype, 33);
      EXPECT_TRUE(same_bits(kernels::transpose_last2(x.to(kGpu)), kernels::transpose_last2(x))) << x.describe();
    }
  }
}

TEST(CudaShapeOps, ConcatSplitSliceAndSliceBackward) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : kDtypes) {
    for (int64_t dim = 0; dim < 3; ++dim) {
      Shape s1{7, 13, 33}, s2{7, 13, 33};
      s2[dim] = 5;
      const Tensor a = random_any(s1, dtype, 34), b = random_any(s2, dtype, 35);
      EXPECT_TRUE(same_bits(kernels::concat({a.to(kGpu), b.to(kGpu)}, dim), kernels::concat({a, b}, dim)))
          << "concat dim " << dim << " " << dtype_name(dtype);
      const std::vector<int64_t> sizes = {1, a.size(dim) - 3, 2};
      const std::vector<Tensor> want = kernels::split(a, sizes, dim), got = kernels::split(a.to(kGpu), sizes, dim);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(same_bits(got[i], want[i])) << "split piece " << i;
      const Tensor piece = kernels::slice(a, dim, 2, 3);
      EXPECT_TRUE(same_bits(kernels::slice(a.to(kGpu), dim, 2, 3), piece)) << "slice dim " << dim;
      if (is_floating(dtype)) {
        EXPECT_TRUE(same_bits(kernels::slice_backward(piece.to(kGpu), s1, dim, 2), kernels::slice_backward(piece, s1, dim, 2)))
            << "slice_backward dim " << dim << " " << dtype_name(dtype);
      }
    }
  }
  // The ViT's class token: [B, 1, C] joined to [B, N, C] along dim 1.
  const Tensor cls = random_any({4, 1, 96}, DType::bf16, 36), patches = random_any({4, 49, 96}, DType::bf16, 37);
  EXPECT_TRUE(same_bits(kernels::concat({cls.to(kGpu), patches.to(kGpu)}, 1), kernels::concat({cls, patches}, 1)));
}

TEST(CudaShapeOps, PatchifyAndUnpatchify) {
  SKIP_WITHOUT_GPU();
  struct Case {
    Shape images;
    int64_t patch;
  };
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (const Case& c : {Case{{2, 3, 32, 48}, 16}, Case{{3, 1, 28, 28}, 4}, Case{{1, 3, 7, 7}, 7}, Case{{2, 2, 6, 9}, 3}}) {
      const Tensor images = random_any(c.images, dtype, 38);
      const Tensor patches = kernels::patchify(images, c.patch);
      EXPECT_TRUE(same_bits(kernels::patchify(images.to(kGpu), c.patch), patches)) << images.describe();
      EXPECT_TRUE(same_bits(kernels::unpatchify(patches.to(kGpu), c.patch, c.images[1], c.images[2], c.images[3]),
                            kernels::unpatchify(patches, c.patch, c.images[1], c.images[2], c.images[3])))
          << patches.describe();
    }
  }
}

TEST(CudaShapeOps, IndexSelectAndItsDeterministicBackward) {
  SKIP_WITHOUT_GPU();
  const Tensor indices = from_vector<int64_t>({4, 0, 4, 2, 6, 4, 0}, {7});
  const Tensor indices32 = indices.to(DType::i32);
  for (DType dtype : kDtypes) {
    for (int64_t dim = 0; dim < 3; ++dim) {
      const Tensor x = random_any({7, 9, 11}, dtype, 39);
      const Tensor want = kernels::index_select(x, dim, indices);
      EXPECT_TRUE(same_bits(kernels::index_select(x.to(kGpu), dim, indices.to(kGpu)), want)) << "dim " << dim;
      EXPECT_TRUE(same_bits(kernels::index_select(x.to(kGpu), dim, indices32), want)) << "i32 indices, dim " << dim;
    }
  }
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int64_t dim = 0; dim < 3; ++dim) {
      const Shape full{7, 9, 11};
      Shape gshape = full;
      gshape[dim] = indices.numel();
      const Tensor grad = random_any(gshape, dtype, 40);
      const Tensor want = kernels::index_select_backward(grad, full, dim, indices);
      const Tensor got = kernels::index_select_backward(grad.to(kGpu), full, dim, indices.to(kGpu));
      EXPECT_TRUE(same_bits(got, want)) << dtype_name(dtype) << " dim " << dim;  // same f32 sums in the same order
    }
  }
}

TEST(CudaShapeOps, TooManyDimsAndUnsupportedDtypesNameTheOpAndTheFix) {
  SKIP_WITHOUT_GPU();
  const Tensor x = random_tensor({2, 3, 2, 3, 2, 3, 2, 3, 2}).to(kGpu);
  EXPECT_TRUE(throws_with([&] { (void)kernels::permute(x, {8, 7, 6, 5, 4, 3, 2, 1, 0}); },
                          {"permute", "at most 8 dims", "Reshape"}));
  const Tensor d = random_tensor({4, 3}, DType::f64).to(kGpu);
  const Tensor idx = from_vector<int64_t>({1, 1}, {2});
  EXPECT_TRUE(throws_with([&] { (void)kernels::index_select_backward(d.narrow(0, 2), {4, 3}, 0, idx); },
                          {"index_select_backward", "f64", ".to(DType::f32)"}));
}

}  // namespace
}  // namespace octet
