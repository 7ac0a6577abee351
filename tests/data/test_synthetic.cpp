// Synthetic images: each index reproducible on its own, labels index mod classes, and the pixels
// standard normal.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "data/synthetic.h"
#include "tests/testing.h"

namespace {

using namespace octet;
using namespace octet::data;
using octet::testing::throws_with;

std::vector<float> image_of(const Dataset& ds, int64_t index, int64_t* label = nullptr) {
  std::vector<float> image(ds.image_shape().numel());
  int64_t l;
  ds.get(index, image.data(), label ? label : &l);
  return image;
}

TEST(Synthetic, EachIndexIsReproducibleOnItsOwn) {
  auto a = make_synthetic(int64_t{1} << 40, {3, 5, 7}, 10, 42);
  auto b = make_synthetic(int64_t{1} << 40, {3, 5, 7}, 10, 42);
  auto other_seed = make_synthetic(int64_t{1} << 40, {3, 5, 7}, 10, 43);
  EXPECT_EQ(a->size(), int64_t{1} << 40);
  EXPECT_EQ(a->image_shape(), (Shape{3, 5, 7}));
  // b reads in a different order from a: no hidden stream position.
  const std::vector<int64_t> indices{0, 1, 2, 99, (int64_t{1} << 32) + 1, (int64_t{1} << 40) - 1};
  std::vector<std::vector<float>> from_a;
  for (int64_t i : indices) from_a.push_back(image_of(*a, i));
  for (size_t k = indices.size(); k-- > 0;)
    EXPECT_EQ(image_of(*b, indices[k]), from_a[k]) << "index " << indices[k];
  for (size_t k = 0; k < indices.size(); ++k) {
    EXPECT_NE(image_of(*other_seed, indices[k]), from_a[k]) << "index " << indices[k];
    for (size_t j = 0; j < k; ++j) EXPECT_NE(from_a[j], from_a[k]) << indices[j] << " vs " << indices[k];
  }
}

TEST(Synthetic, LabelIsIndexModClasses) {
  auto ds = make_synthetic(1000, {1, 2, 2}, 7, 5);
  EXPECT_EQ(ds->num_classes(), 7);
  for (int64_t i : {0, 1, 6, 7, 8, 13, 14, 500, 999}) {
    int64_t label = -1;
    image_of(*ds, i, &label);
    EXPECT_EQ(label, i % 7) << "index " << i;
  }
}

TEST(Synthetic, WritesExactlyOneImageEvenWhenNotAMultipleOfFour) {
  auto ds = make_synthetic(10, {1, 3, 3}, 2, 9);  // 9 values: the last Philox block is partly used
  std::vector<float> buffer(12, 1234.5f);
  int64_t label;
  ds->get(3, buffer.data(), &label);
  for (int k = 0; k < 9; ++k) EXPECT_NE(buffer[k], 1234.5f) << k;
  for (int k = 9; k < 12; ++k) EXPECT_EQ(buffer[k], 1234.5f) << "wrote past the image at " << k;
}

TEST(Synthetic, PixelsAreStandardNormalAndIndependentAcrossImages) {
  auto ds = make_synthetic(400, {3, 8, 8}, 10, 7);
  const int64_t n = 192;
  double sum = 0, sum_sq = 0, sum_cross = 0, count = 0;
  int64_t beyond_two_sigma = 0;
  std::vector<float> previous = image_of(*ds, 0);
  for (int64_t i = 0; i < 400; ++i) {
    const std::vector<float> image = image_of(*ds, i);
    for (int64_t p = 0; p < n; ++p) {
      sum += image[p];
      sum_sq += double(image[p]) * image[p];
      beyond_two_sigma += std::abs(image[p]) > 2.0f;
      if (i > 0) sum_cross += double(image[p]) * previous[p];
    }
    count += n;
    previous = image;
  }
  // 76800 samples: the standard error of the mean is 0.0036 and of the variance 0.005.
  EXPECT_NEAR(sum / count, 0.0, 0.02);
  EXPECT_NEAR(sum_sq / count, 1.0, 0.03);
  EXPECT_NEAR(sum_cross / (count - n), 0.0, 0.02);       // neighbouring images are uncorrelated
  EXPECT_NEAR(beyond_two_sigma / count, 0.0455, 0.004);  // P(|z| > 2) of a normal, not just any unit variance
}

TEST(Synthetic, RejectsBadArguments) {
  EXPECT_TRUE(throws_with([] { make_synthetic(0, {1, 2, 2}, 3, 0); }, {"make_synthetic", "size is 0"}));
  EXPECT_TRUE(throws_with([] { make_synthetic(5, {2, 2}, 3, 0); }, {"make_synthetic", "[2, 2]", "[C, H, W]"}));
  EXPECT_TRUE(throws_with([] { make_synthetic(5, {1, 2, 2}, 0, 0); }, {"num_classes is 0"}));
  auto ds = make_synthetic(5, {1, 2, 2}, 3, 0);
  EXPECT_TRUE(throws_with([&] { image_of(*ds, 5); }, {"index 5", "out of range"}));
}

}  // namespace
