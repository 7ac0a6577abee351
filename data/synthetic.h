#pragma once
// Random images for throughput runs and tests: no files, any shape and class count. Image i is
// standard normal noise from Philox keyed by the seed, with i in the counter's upper words, so any
// index is reproducible on its own (no stream to replay); its label is i mod num_classes.
#include <cstdint>
#include <memory>

#include "data/dataset.h"

namespace octet::data {

class SyntheticImages : public Dataset {
 public:
  SyntheticImages(int64_t size, Shape image_shape, int64_t num_classes, uint64_t seed);

  int64_t size() const override { return size_; }
  Shape image_shape() const override { return image_shape_; }
  int64_t num_classes() const override { return num_classes_; }
  void get(int64_t index, float* image, int64_t* label) const override;

 private:
  int64_t size_;
  Shape image_shape_;
  int64_t num_classes_;
  uint64_t seed_;
};

std::unique_ptr<SyntheticImages> make_synthetic(int64_t size, Shape image_shape, int64_t num_classes,
                                                uint64_t seed);

}  // namespace octet::data
