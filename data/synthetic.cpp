#include "data/synthetic.h"

#include <cmath>

#include "core/error.h"
#include "core/philox.h"

namespace octet::data {

SyntheticImages::SyntheticImages(int64_t size, Shape image_shape, int64_t num_classes, uint64_t seed)
    : size_(size), image_shape_(std::move(image_shape)), num_classes_(num_classes), seed_(seed) {
  OCTET_CHECK(size_ > 0, "make_synthetic: size is ", size_, "; ask for at least one image");
  OCTET_CHECK(image_shape_.ndim() == 3 && image_shape_.numel() > 0, "make_synthetic: image shape ", image_shape_,
              " is not [C, H, W] with positive dims");
  OCTET_CHECK(num_classes_ > 0, "make_synthetic: num_classes is ", num_classes_, "; it must be positive");
}

void SyntheticImages::get(int64_t index, float* image, int64_t* label) const {
  OCTET_CHECK(index >= 0 && index < size_, "SyntheticImages: index ", index, " out of range [0, ", size_, ")");
  const int64_t n = image_shape_.numel();
  const auto k0 = static_cast<uint32_t>(seed_), k1 = static_cast<uint32_t>(seed_ >> 32);
  const auto i0 = static_cast<uint32_t>(index), i1 = static_cast<uint32_t>(static_cast<uint64_t>(index) >> 32);
  // Block b of image i: counter (b, i). Box-Muller turns each block's four words into four normals,
  // the same transform as randn (core/tensor.cpp).
  for (int64_t first = 0; first < n; first += 4) {
    const auto block = static_cast<uint64_t>(first / 4);
    const philox::Words w = philox::philox4x32_10(
        {{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), i0, i1}}, k0, k1);
    float v[4];
    for (int pair = 0; pair < 2; ++pair) {
      const float radius = std::sqrt(-2.0f * std::log(philox::uniform_open_zero(w.w[2 * pair])));
      const float angle = 6.2831853071795864f * philox::uniform(w.w[2 * pair + 1]);
      v[2 * pair] = radius * std::cos(angle);
      v[2 * pair + 1] = radius * std::sin(angle);
    }
    for (int k = 0; k < 4 && first + k < n; ++k) image[first + k] = v[k];
  }
  *label = index % num_classes_;
}

std::unique_ptr<SyntheticImages> make_synthetic(int64_t size, Shape image_shape, int64_t num_classes,
                                                uint64_t seed) {
  return std::make_unique<SyntheticImages>(size, std::move(image_shape), num_classes, seed);
}

}  // namespace octet::data
