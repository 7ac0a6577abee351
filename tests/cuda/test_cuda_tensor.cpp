// Tensors on the GPU: copies to and from the device, and conversions, fills and copies of device
// tensors. Conversions run on the device and must give the host's bits for every pair of dtypes.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <vector>

#include "core/cuda_memory.h"
#include "core/cuda_stream.h"
#include "core/storage.h"
#include "autograd/ops.h"
#include "core/tensor.h"
#include "tests/testing.h"
#include "tests/cuda/cuda_testing.h"

namespace octet {
namespace {

using testing::kGpu;
using testing::same_bits;

const std::vector<DType> kAllDtypes = {DType::f32,  DType::f64, DType::bf16, DType::f16, DType::e4m3,
                                       DType::e5m2, DType::i32, DType::i64,  DType::u8};

// Values that exercise every rounding and saturation rule: random normals at several scales,
// signed zeros, infinities, NaNs with payloads and signs, FP8 and f16 limits and their neighbours,
// subnormals of every format, and integers beyond 2^53 and outside the integer ranges.
Tensor conversion_inputs() {
  std::vector<double> v = testing::random_tensor({600}, DType::f64, 41).to_vector<double>();
  const std::vector<double> scales = {1e-6, 1e-3, 1, 30, 500, 7e4, 1e9};
  for (size_t i = 0; i < v.size(); ++i) v[i] *= scales[i % scales.size()];
  const double inf = std::numeric_limits<double>::infinity();
  uint64_t payload_bits = 0x7FF4000000000123ull, negative_nan_bits = 0xFFF8000000000000ull | (3ull << 50);
  double payload_nan, negative_nan;
  std::memcpy(&payload_nan, &payload_bits, sizeof payload_nan);
  std::memcpy(&negative_nan, &negative_nan_bits, sizeof negative_nan);
  const std::vector<double> specials = {
      0.0, -0.0, inf, -inf, std::numeric_limits<double>::quiet_NaN(), payload_nan, negative_nan, 448, 464, 480, -449,
      57344, 61440, 65504, 65520, -65536, 3.3895313892515355e38, 3.5e38, 1e300, -1e-300, 1e-40, 5.9604644775390625e-08,
      2.98e-08, 0.001953125, 0.0009765625, 1.52587890625e-05, 9007199254740993.0, -9.3e18, 255, 255.5, 256, -1, -128.7,
      2147483647, 2147483648.0, -2147483649.0, 0.5, 1.5, 2.5, -2.5, 1.0 / 3};
  v.insert(v.end(), specials.begin(), specials.end());
  return from_vector(v, {static_cast<int64_t>(v.size())}, DType::f64);
}

TEST(Cuda, TensorsRoundTripThroughTheDevice) {
  SKIP_WITHOUT_GPU();
  const Tensor host = arange(0.0, 1000.0, 1.0, DType::f32);
  const Tensor dev = host.to(kGpu);
  EXPECT_TRUE(dev.is_cuda());
  EXPECT_EQ(dev.to(Device::cpu()).to_vector<float>(), host.to_vector<float>());
  EXPECT_EQ(dev.to(DType::bf16).to_vector<float>(), host.to(DType::bf16).to_vector<float>());
}

// autograd's to_device moves the gradient back to the input's device: y = sum(to_device(x, other) * w)
// gives x.grad = w on x's device, from the CPU to the GPU and back (the CPU-only gradcheck of
// to_device moves nothing).
TEST(Cuda, ToDeviceCarriesTheGradientBackToTheInputsDevice) {
  SKIP_WITHOUT_GPU();
  const Tensor w_values = testing::random_tensor({4, 5}, DType::f32, 70);
  for (const bool from_cpu : {true, false}) {
    SCOPED_TRACE(from_cpu ? "cpu -> gpu" : "gpu -> cpu");
    const Device home = from_cpu ? Device::cpu() : kGpu, other = from_cpu ? kGpu : Device::cpu();
    Tensor x = testing::random_tensor({4, 5}, DType::f32, 71).to(home);
    x.requires_grad_();
    const Tensor moved = to_device(x, other);
    EXPECT_EQ(moved.device(), other);
    sum(mul(moved, w_values.to(other))).backward();
    ASSERT_TRUE(x.grad().defined());
    EXPECT_EQ(x.grad().device(), home);
    EXPECT_TRUE(same_bits(x.grad(), w_values));  // d/dx of Σ x·w is w, exactly
  }
}

// backward's explicit gradient must live where its root does: a CPU gradient for a GPU loss is
// refused at the root, naming both, where it used to pass the shape check and fail deep inside the
// first backward closure as a bug of that op.
TEST(Cuda, ARootGradientOnAnotherDeviceIsRefused) {
  SKIP_WITHOUT_GPU();
  Tensor x = testing::random_tensor({3, 2}).to(kGpu);
  x.requires_grad_();
  const Tensor y = mul(x, 2.0);
  EXPECT_TRUE(testing::throws_with([&] { y.backward(testing::random_tensor({3, 2})); },
                                   {"backward: gradient", "cpu", "does not match root", "cuda", "its device"}));
}

// The saved-activation figure reads this around a forward (core/storage.h, memory_in_use).
TEST(Cuda, MemoryInUseCountsTheDevicesLiveStorages) {
  SKIP_WITHOUT_GPU();
  const size_t before = memory_in_use(kGpu);
  EXPECT_EQ(before, cuda_memory::memory_stats(0).in_use);
  {
    const Tensor t = empty({1000, 3}, DType::bf16, kGpu);
    EXPECT_EQ(memory_in_use(kGpu) - before, 6000u);
    t.storage()->release();
    EXPECT_EQ(memory_in_use(kGpu), before);
    t.storage()->reallocate();
    EXPECT_EQ(memory_in_use(kGpu) - before, 6000u);
  }
  EXPECT_EQ(memory_in_use(kGpu), before);
}

TEST(Cuda, DeviceConversionsGiveTheHostsBitsForEveryPair) {
  SKIP_WITHOUT_GPU();
  const Tensor values = conversion_inputs();
  for (DType from : kAllDtypes) {
    const Tensor src = values.to(from);  // the host's conversion, so every source holds its own specials
    const Tensor src_gpu = src.to(kGpu);
    for (DType to : kAllDtypes) {
      EXPECT_TRUE(same_bits(src_gpu.to(to), src.to(to))) << dtype_name(from) << " -> " << dtype_name(to);
      // A view one element in: the conversion's wide-access path must step aside.
      const int64_t n = src.numel() - 1;
      EXPECT_TRUE(same_bits(src_gpu.narrow(1, n).to(to), src.narrow(1, n).to(to)))
          << dtype_name(from) << " -> " << dtype_name(to) << " at an offset";
    }
  }
}

TEST(Cuda, FillWritesTheHostsPatternForEveryDtype) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : kAllDtypes) {
    for (double value : {0.0, 1.0, -3.25, 1e10, 0.1}) {
      for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{100003}}) {
        const Tensor want = full({n}, value, dtype);
        EXPECT_TRUE(same_bits(full({n}, value, dtype, kGpu), want)) << dtype_name(dtype) << " " << value << " x" << n;
        // fill_ on a view at an offset leaves the rest of the storage alone.
        const Tensor buffer = zeros({n + 3}, dtype, kGpu);
        buffer.narrow(1, n).fill_(value);
        const Tensor expected = zeros({n + 3}, dtype);
        expected.narrow(1, n).fill_(value);
        EXPECT_TRUE(same_bits(buffer, expected)) << dtype_name(dtype) << " view fill " << value;
      }
    }
  }
  EXPECT_TRUE(same_bits(ones({5, 3}, DType::bf16, kGpu), ones({5, 3}, DType::bf16)));
  EXPECT_TRUE(same_bits(zeros({5, 3}, DType::f32, kGpu), zeros({5, 3}, DType::f32)));
}

TEST(Cuda, CopyConvertsOnAndBetweenDevices) {
  SKIP_WITHOUT_GPU();
  const Tensor values = testing::random_tensor({1001}, DType::f32, 42, 100);
  for (DType dst_dtype : {DType::f32, DType::bf16, DType::e4m3, DType::i32}) {
    const Tensor want = values.to(dst_dtype);
    // device <- device (same and other dtype), device <- host, host <- device.
    const Tensor on_gpu = empty({1001}, dst_dtype, kGpu);
    on_gpu.copy_(values.to(kGpu));
    EXPECT_TRUE(same_bits(on_gpu, want)) << "cuda <- cuda f32, into " << dtype_name(dst_dtype);
    const Tensor from_host = empty({1001}, dst_dtype, kGpu);
    from_host.copy_(values);
    EXPECT_TRUE(same_bits(from_host, want)) << "cuda <- cpu f32, into " << dtype_name(dst_dtype);
    const Tensor to_host = empty({1001}, dst_dtype);
    to_host.copy_(values.to(kGpu));
    EXPECT_TRUE(same_bits(to_host, want)) << "cpu <- cuda f32, into " << dtype_name(dst_dtype);
    const Tensor same = empty({1001}, dst_dtype, kGpu);
    same.copy_(on_gpu);
    EXPECT_TRUE(same_bits(same, want)) << "cuda <- cuda, both " << dtype_name(dst_dtype);
  }
  // Into a view of a flat buffer at an offset (an FSDP flat parameter, say).
  const Tensor flat = zeros({2000}, DType::bf16, kGpu);
  flat.narrow(5, 1001).copy_(values.to(kGpu));
  const Tensor expected = zeros({2000}, DType::bf16);
  expected.narrow(5, 1001).copy_(values);
  EXPECT_TRUE(same_bits(flat, expected));
}

TEST(Cuda, ConversionsFollowTheCurrentStream) {
  SKIP_WITHOUT_GPU();
  // Work queued under a StreamGuard is ordered on that stream: reading back after synchronising it
  // sees the conversion.
  cudaStream_t side = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), cudaSuccess);
  {
    cuda::StreamGuard guard(0, side);
    const Tensor x = testing::random_tensor({100003}, DType::f32, 43).to(kGpu);
    const Tensor y = x.to(DType::bf16);
    EXPECT_TRUE(same_bits(y, x.to(Device::cpu()).to(DType::bf16)));
  }
  cudaStreamSynchronize(side);
  cudaStreamDestroy(side);
}

}  // namespace
}  // namespace octet
