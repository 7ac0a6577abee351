// Tensors on the GPU: copies to and from the device, and conversions of device tensors.
#include <gtest/gtest.h>

#include "core/tensor.h"

namespace octet {
namespace {

TEST(Cuda, TensorsRoundTripThroughTheDevice) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device on this machine; this test runs on the GPU machine";
  const Tensor host = arange(0.0, 1000.0, 1.0, DType::f32);
  const Tensor dev = host.to(Device::cuda(0));
  EXPECT_TRUE(dev.is_cuda());
  EXPECT_EQ(dev.to(Device::cpu()).to_vector<float>(), host.to_vector<float>());
  EXPECT_EQ(dev.to(DType::bf16).to_vector<float>(), host.to(DType::bf16).to_vector<float>());
}

}  // namespace
}  // namespace octet
