#pragma once
// Fashion-MNIST (Xiao et al. 2017): 28x28 grey images of clothing in 10 classes, 60000 for training
// and 10000 for testing, shipped as four IDX files. Pixels stay u8 in memory (47 MB for the
// training set) and are normalised on the fly through a 256-entry table.
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/idx.h"

namespace octet::data {

// x -> (x/255 - mean) / std, per channel (one channel here).
struct Normalization {
  double mean = 0;
  double std = 1;
};

// The training set's own pixel statistics (in [0, 1] units), as torchvision users normalise with.
inline constexpr Normalization kFashionMnistNormalization{0.2860, 0.3530};
inline constexpr const char* kFashionMnistDefaultDir = "/usr/share/datasets/fashion-mnist";
inline constexpr int64_t kFashionMnistClasses = 10;

class FashionMnist : public Dataset {
 public:
  // Checks that the counts agree and every label is a class; use load_fashion_mnist for files.
  FashionMnist(IdxImages images, std::vector<uint8_t> labels, Normalization norm = kFashionMnistNormalization);

  int64_t size() const override { return images_.count; }
  Shape image_shape() const override { return {1, images_.rows, images_.cols}; }
  int64_t num_classes() const override { return kFashionMnistClasses; }
  void get(int64_t index, float* image, int64_t* label) const override;

  const Normalization& normalization() const { return norm_; }
  const uint8_t* pixels(int64_t index) const;  // the raw u8 image
  uint8_t label(int64_t index) const;

 private:
  IdxImages images_;
  std::vector<uint8_t> labels_;
  Normalization norm_;
  std::array<float, 256> table_;  // u8 pixel -> normalised value
};

// Reads train-{images-idx3,labels-idx1}-ubyte (train) or t10k-* (test) from `dir`, each gzip'd
// (.gz) or not; dir "" means kFashionMnistDefaultDir. A missing folder or file says how to install
// the data set (Debian's dataset-fashion-mnist) or where to point --data-dir.
std::unique_ptr<FashionMnist> load_fashion_mnist(const std::string& dir, bool train,
                                                 Normalization norm = kFashionMnistNormalization);

}  // namespace octet::data
