// The host/device functions shared by CPU and CUDA code (format conversions, Philox) must give the
// same bits on the GPU as on the host: the GPU's dropout masks and FP8 casts rely on it.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/device.h"
#include "core/float_formats.h"
#include "core/philox.h"
#include "tests/cuda/cuda_testing.h"

namespace octet {
namespace {

__global__ void decode_all_codes(float* e4m3, float* e5m2, float* bf16_hi) {
  const int code = blockIdx.x * blockDim.x + threadIdx.x;
  if (code < 256) {
    e4m3[code] = e4m3_to_float(static_cast<uint8_t>(code));
    e5m2[code] = e5m2_to_float(static_cast<uint8_t>(code));
  }
  if (code < 65536) bf16_hi[code] = bf16_bits_to_float(static_cast<uint16_t>(code));
}

__global__ void encode(const float* x, int n, uint8_t* e4m3, uint8_t* e5m2, uint16_t* bf16, uint16_t* f16) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  e4m3[i] = float_to_e4m3(x[i], true);
  e5m2[i] = float_to_e5m2(x[i], true);
  bf16[i] = float_to_bf16_bits(x[i]);
  f16[i] = float_to_f16_bits(x[i]);
}

__global__ void philox_blocks(uint64_t seed, uint64_t first, int blocks, uint32_t* out) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= blocks) return;
  const philox::Words w = philox::block_words(seed, first + b);
  for (int k = 0; k < 4; ++k) out[4 * b + k] = w.w[k];
}

template <class T>
std::vector<T> download(const T* device_ptr, size_t n) {
  std::vector<T> host(n);
  cudaMemcpy(host.data(), device_ptr, n * sizeof(T), cudaMemcpyDeviceToHost);
  return host;
}

TEST(CudaDeviceMath, DecodingMatchesTheHost) {
  SKIP_WITHOUT_GPU();
  float *e4m3, *e5m2, *bf16;
  cudaMalloc(&e4m3, 256 * 4);
  cudaMalloc(&e5m2, 256 * 4);
  cudaMalloc(&bf16, 65536 * 4);
  decode_all_codes<<<256, 256>>>(e4m3, e5m2, bf16);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto d4 = download(e4m3, 256), d5 = download(e5m2, 256), db = download(bf16, 65536);
  for (int c = 0; c < 256; ++c) {
    const float h4 = e4m3_to_float(c);
    EXPECT_EQ(std::memcmp(&d4[c], &h4, 4), 0) << "e4m3 code " << c;
    const float h5 = e5m2_to_float(c);
    EXPECT_EQ(std::memcmp(&d5[c], &h5, 4), 0) << "e5m2 code " << c;
  }
  for (int c = 0; c < 65536; ++c) {
    const float h = bf16_bits_to_float(c);
    ASSERT_EQ(std::memcmp(&db[c], &h, 4), 0) << "bf16 code " << c;
  }
  cudaFree(e4m3);
  cudaFree(e5m2);
  cudaFree(bf16);
}

TEST(CudaDeviceMath, EncodingMatchesTheHost) {
  SKIP_WITHOUT_GPU();
  // Every float whose bits step by 2^12 (ties and subnormals of every format included), both signs.
  std::vector<float> x;
  for (uint64_t k = 0; k < (1ull << 20); ++k) {
    const uint32_t bits = static_cast<uint32_t>(k << 12) + static_cast<uint32_t>(k % 3) - 1u;
    float f;
    std::memcpy(&f, &bits, 4);
    x.push_back(f);
  }
  const int n = static_cast<int>(x.size());
  float* dx;
  uint8_t *d4, *d5;
  uint16_t *db, *dh;
  cudaMalloc(&dx, n * 4);
  cudaMalloc(&d4, n);
  cudaMalloc(&d5, n);
  cudaMalloc(&db, n * 2);
  cudaMalloc(&dh, n * 2);
  cudaMemcpy(dx, x.data(), n * 4, cudaMemcpyHostToDevice);
  encode<<<(n + 255) / 256, 256>>>(dx, n, d4, d5, db, dh);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto g4 = download(d4, n), g5 = download(d5, n);
  const auto gb = download(db, n), gh = download(dh, n);
  int mismatches = 0;
  for (int i = 0; i < n && mismatches < 10; ++i) {
    const bool same = g4[i] == float_to_e4m3(x[i], true) && g5[i] == float_to_e5m2(x[i], true) &&
                      gb[i] == float_to_bf16_bits(x[i]) && gh[i] == float_to_f16_bits(x[i]);
    if (!same) {
      ++mismatches;
      ADD_FAILURE() << "input " << x[i] << " encodes differently on the device";
    }
  }
  cudaFree(dx);
  cudaFree(d4);
  cudaFree(d5);
  cudaFree(db);
  cudaFree(dh);
}

TEST(CudaDeviceMath, PhiloxMatchesTheHost) {
  SKIP_WITHOUT_GPU();
  const int blocks = 4096;
  const uint64_t seed = 0x0123456789abcdefull, first = (1ull << 32) - 100;  // crosses the 32-bit carry
  uint32_t* out;
  cudaMalloc(&out, blocks * 16);
  philox_blocks<<<blocks / 128, 128>>>(seed, first, blocks, out);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got = download(out, blocks * 4);
  for (int b = 0; b < blocks; ++b) {
    const philox::Words w = philox::block_words(seed, first + b);
    for (int k = 0; k < 4; ++k) ASSERT_EQ(got[4 * b + k], w.w[k]) << "block " << b << " word " << k;
  }
  cudaFree(out);
}

}  // namespace
}  // namespace octet
