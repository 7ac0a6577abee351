// Mismatched devices, dtypes and shapes: each error names the op, describes every tensor involved
// and says what to do. A "cuda:0" tensor is faked over host memory (external storage) so the device
// checks are exercised on machines without a GPU; the checks fail before any byte is touched.
#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <string>

#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/nn_ops.h"
#include "kernels/shape_ops.h"
#include "tests/testing.h"

namespace octet {
namespace {

Tensor fake_cuda_tensor(const Shape& shape) {
  const Tensor host = testing::random_tensor(shape);
  // Keep the host block alive through the deleter; the storage claims to be on cuda:0.
  auto storage = std::make_shared<Storage>(host.data_ptr(), host.nbytes(), Device::cuda(0), [host](void*) {});
  return Tensor(storage, 0, shape, DType::f32);
}

void expect_message(const std::function<void()>& fn, std::initializer_list<std::string> fragments) {
  EXPECT_TRUE(octet::testing::throws_with(fn, fragments));
}

TEST(KernelErrors, DevicesMismatchNamesBothDevicesAndTheFix) {
  const Tensor a = testing::random_tensor({2, 3});
  const Tensor b = fake_cuda_tensor({2, 3});
  expect_message([&] { kernels::add(a, b); }, {"add", "f32[2, 3] on cpu", "f32[2, 3] on cuda:0", ".to(device)"});
  expect_message([&] { kernels::matmul(a, fake_cuda_tensor({3, 4})); }, {"cpu", "cuda:0"});
}

TEST(KernelErrors, DtypesMismatchNamesBothDtypes) {
  const Tensor a = testing::random_tensor({4});
  const Tensor b = testing::random_tensor({4}, DType::bf16);
  expect_message([&] { kernels::mul(a, b); }, {"mul", "f32[4]", "bf16[4]", ".to(dtype)"});
}

TEST(KernelErrors, ShapesThatCannotBroadcastNameBothShapes) {
  expect_message([&] { kernels::sub(testing::random_tensor({2, 3}), testing::random_tensor({4})); },
                 {"sub", "[2, 3]", "[4]"});
  expect_message(
      [&] { kernels::layernorm_forward(testing::random_tensor({2, 8}), testing::random_tensor({7}), Tensor()); },
      {"layernorm", "[2, 8]", "[7]"});
  expect_message([&] { kernels::concat({testing::random_tensor({2, 3}), testing::random_tensor({2, 4})}, 0); },
                 {"concat", "[2, 3]", "[2, 4]"});
}

TEST(KernelErrors, CudaTensorsOnAMachineWithoutTheirDeviceAreRefused) {
  // The fake tensor claims cuda:0 but holds host memory: on a real GPU a kernel would fault on it.
  if (cuda::is_available()) GTEST_SKIP() << "this machine has a GPU; the refusal is tested where there is none";
#if OCTET_HAS_CUDA
  // exp has a CUDA kernel: allocating its output names the missing device.
  expect_message([&] { kernels::exp(fake_cuda_tensor({3})); }, {"cuda:0", "0 CUDA device"});
#else
  expect_message([&] { kernels::exp(fake_cuda_tensor({3})); }, {"exp", "cuda:0", "built without CUDA"});
#endif
}

}  // namespace
}  // namespace octet
