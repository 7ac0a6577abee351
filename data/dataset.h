#pragma once
// What a training loop reads: a fixed-size collection of labelled images. Images come out already
// normalised as f32 [C, H, W], written straight into the caller's buffer, so the loader can
// assemble a batch without an extra copy.
#include <cstdint>

#include "core/shape.h"

namespace octet::data {

class Dataset {
 public:
  virtual ~Dataset();

  virtual int64_t size() const = 0;
  virtual Shape image_shape() const = 0;  // [C, H, W]
  virtual int64_t num_classes() const = 0;
  // Writes image `index` (image_shape().numel() floats) and its label. Must be safe to call from
  // several threads at once: the loader calls it from its prefetch thread.
  virtual void get(int64_t index, float* image, int64_t* label) const = 0;
};

}  // namespace octet::data
