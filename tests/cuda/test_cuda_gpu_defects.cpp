// GPU paths that ordinary tests pass over: the division after NCCL's sum that makes a bf16/f16
// average exact, kernels for a second GPU launched while the first is current, releases the driver
// refuses, the cudaMalloc path for devices without memory pools, and element counts just under
// 2^32, where a 32-bit grid-stride index wraps.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/cuda_memory.h"
#include "core/cuda_stream.h"
#include "core/tensor.h"
#include "distributed/nccl_process_group.h"
#include "kernels/cuda/elementwise_cuda.h"
#include "kernels/elementwise.h"
#include "kernels/shape_ops.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/testing.h"

namespace octet {
namespace {

using testing::kGpu;
using testing::same_bits;

// Waits for the device's compute stream. A kernel still running after `seconds` cannot be stopped,
// and every later synchronisation would hang behind it, so the process ends with a message.
void finish_within(int device, double seconds, const char* what) {
  const cudaStream_t stream = cuda::compute_stream(device);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (true) {
    const cudaError_t status = cudaStreamQuery(stream);
    if (status == cudaSuccess) return;
    if (status != cudaErrorNotReady) cuda::check(status, what);
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "%s is still running after %.0f s\n", what, seconds);
      std::fflush(nullptr);
      std::_Exit(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Ends a death-test child: 0 and `passed` on stderr when `problem` is empty, else 1 and the problem.
[[noreturn]] void exit_child(const std::string& problem, const char* passed) {
  std::fprintf(stderr, "%s\n", problem.empty() ? passed : problem.c_str());
  std::fflush(nullptr);
  std::_Exit(problem.empty() ? 0 : 1);
}

// Random normals at scales from 100 down to f16's subnormals (below 6.1e-5), rounded to `dtype`.
Tensor mixed_scale_values(int64_t n, DType dtype, uint64_t seed) {
  std::vector<double> v = testing::random_tensor({n}, DType::f64, seed).to_vector<double>();
  const double scales[] = {100.0, 1.0, 1e-3, 3e-5, 1e-6};
  for (size_t i = 0; i < v.size(); ++i) v[i] *= scales[i % 5];
  return from_vector(v, {n}, dtype);
}

// ---- 1. bf16/f16 averages: NCCL's sum, then one division in f32 ----------------------------------

// The division NcclProcessGroup queues after NCCL's sum gives x / N rounded once from float64, bit
// for bit, where multiplying by 1/N (or NCCL's ncclAvg, with 1/N rounded to the dtype) does not.
TEST(CudaGpuDefects, HalfPrecisionAverageDivisionRoundsTheExactQuotientOnce) {
  SKIP_WITHOUT_GPU();
  for (DType d : {DType::bf16, DType::f16}) {
    const Tensor x = mixed_scale_values(4099, d, 300);
    const std::vector<double> xs = x.to_vector<double>();
    for (int n : {3, 5, 6, 7, 14}) {
      std::vector<double> quotients(xs.size());
      for (size_t i = 0; i < xs.size(); ++i) quotients[i] = xs[i] / n;
      const Tensor want = from_vector(quotients, x.shape(), d);  // rounded once from float64
      const Tensor got = x.to(kGpu);
      kernels::cuda::div_scalar_(got, n);
      EXPECT_TRUE(same_bits(got, want)) << dtype_name(d) << " / " << n;
    }
  }
  // A tie in f16's subnormals: 0x1.6cp-18 / 14 = 6.5 · 2^-24 rounds to even, 6 · 2^-24; times
  // float(1/14), a hair above 1/14, it would round to 7 · 2^-24.
  const Tensor tie = from_vector(std::vector<double>{0x1.6cp-18}, {1}, DType::f16).to(kGpu);
  kernels::cuda::div_scalar_(tie, 14);
  EXPECT_EQ(tie.item(), 0x1.8p-22);
}

// The group's average runs that division on the communication stream inside the collective. At one
// rank it divides by 1 and must leave every bit (at one rank NCCL's own average could not be told
// apart either: tests/distributed/test_nccl_mapping.cpp checks what NCCL is asked for).
TEST(CudaGpuDefects, NcclAverageOfHalfPrecisionRunsItsDivisionAtOneRank) {
  SKIP_WITHOUT_GPU();
  distributed::NcclProcessGroup group(kGpu);
  for (DType d : {DType::bf16, DType::f16, DType::f32}) {
    const Tensor x = mixed_scale_values(1003, d, 310);
    const Tensor reduced = x.to(kGpu);
    group.all_reduce(reduced, distributed::ReduceOp::Avg)->wait();
    EXPECT_TRUE(same_bits(reduced, x)) << dtype_name(d);
    const Tensor scattered = empty(x.shape(), d, kGpu);
    group.reduce_scatter(scattered, x.to(kGpu), distributed::ReduceOp::Avg)->wait();
    EXPECT_TRUE(same_bits(scattered, x)) << dtype_name(d);
  }
}

// ---- 2. kernels go to their tensors' device --------------------------------------------------------

// CUDA refuses a launch on a stream of a device other than the current one; every op must make its
// tensors' device current first.
TEST(CudaGpuDefects, OpsOnTheSecondGpuRunWhileTheFirstIsCurrent) {
  SKIP_WITHOUT_GPU();
  if (cuda::device_count() < 2) {
    GTEST_SKIP() << "needs 2 CUDA devices and this machine has " << cuda::device_count()
                 << "; the test runs ops on cuda:1 while cuda:0 is current";
  }
  const Device second = Device::cuda(1);
  const Tensor a = testing::random_tensor({257, 129}, DType::f32, 81);
  const Tensor b = testing::random_tensor({257, 129}, DType::f32, 82);
  const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();

  cuda::check(cudaSetDevice(0), "cudaSetDevice");
  const Tensor sum = kernels::add(a.to(second), b.to(second));  // elementwise.cu
  cuda::check(cudaSetDevice(0), "cudaSetDevice");
  const Tensor moved = kernels::permute(sum, {1, 0});  // shape_ops.cu
  cuda::check(cudaSetDevice(0), "cudaSetDevice");
  const Tensor halves = sum.to(DType::bf16);
  kernels::cuda::div_scalar_(halves, 2);
  cuda::check(cudaSetDevice(0), "cudaSetDevice");

  EXPECT_EQ(sum.device(), second);
  EXPECT_EQ(moved.device(), second);
  std::vector<double> want(av.size()), want_moved(av.size()), want_halves(av.size());
  for (size_t i = 0; i < av.size(); ++i) {
    want[i] = av[i] + bv[i];
    want_moved[(i % 129) * 257 + i / 129] = want[i];
  }
  const std::vector<double> sums = sum.to_vector<double>();
  for (size_t i = 0; i < sums.size(); ++i) want_halves[i] = sums[i] / 2;
  EXPECT_TRUE(testing::all_close(sum, want, 1e-6, 1e-6));
  EXPECT_TRUE(testing::all_close(moved, want_moved, 1e-6, 1e-6));
  EXPECT_TRUE(testing::all_close(halves, want_halves, 0, 1.0 / 256));
}

// ---- 3. release never throws -----------------------------------------------------------------------

// In a child process: release() of a device that does not exist and of memory the pool never handed
// out logs each failure and returns (before, the first threw out of a noexcept function and ended
// the program), and the next kernel launch does not take the failed free's error for its own.
[[noreturn]] void release_refused_by_the_driver() {
  std::string problem;
  try {
    const Tensor x = testing::random_tensor({4096}, DType::f32, 91);
    const Tensor on_gpu = x.to(kGpu);  // the device's allocator is in use, as in any program
    cuda_memory::release(nullptr, 0, cuda::device_count());  // cudaSetDevice fails
    int not_device_memory = 0;
    cuda_memory::release(&not_device_memory, 0, 0);  // cudaFreeAsync fails
    const std::vector<double> doubled = kernels::add(on_gpu, on_gpu).to_vector<double>();
    const std::vector<double> xs = x.to_vector<double>();
    for (size_t i = 0; i < xs.size() && problem.empty(); ++i) {
      if (doubled[i] != 2 * xs[i]) problem = "x + x is wrong at element " + std::to_string(i);
    }
  } catch (const std::exception& e) {
    problem = std::string("an op after the failed releases threw: ") + e.what();
  }
  exit_child(problem, "release checks passed");
}

TEST(CudaGpuDefects, ReleaseLogsWhatTheDriverRefusesAndNeverThrows) {
  SKIP_WITHOUT_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process, not a fork of one using CUDA
  EXPECT_EXIT(release_refused_by_the_driver(), ::testing::ExitedWithCode(0),
              "cudaSetDevice.*release checks passed");
}

// ---- 4. devices without memory pools -----------------------------------------------------------------

// In a child process whose devices take the cudaMalloc/cudaFree path (OCTET_NO_CUDA_MEMORY_POOL=1,
// the path a device without cudaDevAttrMemoryPoolsSupported takes): results stay right while blocks
// are freed and reallocated between kernels, and the statistics count exactly the live bytes, with
// reserved = in use.
[[noreturn]] void plain_cuda_malloc_path() {
  setenv("OCTET_NO_CUDA_MEMORY_POOL", "1", 1);  // before the device's first allocation
  std::string problem;
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok && problem.empty()) problem = what;
  };
  try {
    using cuda_memory::memory_stats;
    const cuda_memory::MemoryStats before = memory_stats(0);
    expect(before.reserved == before.in_use && before.reserved_peak == before.peak,
           "before any allocation, reserved differs from in use");
    constexpr size_t kBytes = size_t{4} << 20;  // one f32 tensor of 2^20 elements
    const Tensor x = testing::random_tensor({1 << 20}, DType::f32, 92);
    {
      const Tensor a = x.to(kGpu);
      Tensor b = kernels::mul_scalar(a, 3.0);
      const cuda_memory::MemoryStats two = memory_stats(0);
      expect(two.in_use == before.in_use + 2 * kBytes, "in use is not the two live tensors");
      expect(two.reserved == two.in_use, "reserved differs from in use with two tensors live");
      // Each step frees the previous b right after the kernel that reads it is queued.
      for (int i = 0; i < 20; ++i) b = kernels::add(b, a);
      const std::vector<double> xs = x.to_vector<double>();
      std::vector<double> want(xs.size());
      for (size_t i = 0; i < xs.size(); ++i) want[i] = 23 * xs[i];
      expect(static_cast<bool>(testing::all_close(b, want, 1e-6, 1e-5)), "3x + 20x is wrong");
    }
    const cuda_memory::MemoryStats after = memory_stats(0);
    expect(after.in_use == before.in_use, "in use did not return to its start");
    expect(after.reserved == after.in_use, "reserved differs from in use after the frees");
    expect(after.peak == before.in_use + 3 * kBytes, "peak is not three tensors (a, b and the next b)");
    expect(after.reserved_peak == after.peak, "reserved peak differs from peak");
    cuda_memory::reset_peak_memory_stats(0);
    const cuda_memory::MemoryStats reset = memory_stats(0);
    expect(reset.peak == reset.in_use && reset.reserved_peak == reset.peak, "reset_peak did not reset");
  } catch (const std::exception& e) {
    problem = std::string("threw: ") + e.what();
  }
  exit_child(problem, "plain malloc checks passed");
}

TEST(CudaGpuDefects, WithoutAMemoryPoolBlocksComeFromCudaMallocAndStatisticsHold) {
  SKIP_WITHOUT_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(plain_cuda_malloc_path(), ::testing::ExitedWithCode(0),
              "OCTET_NO_CUDA_MEMORY_POOL is set.*plain malloc checks passed");
}

// ---- 5. element counts just under 2^32 -------------------------------------------------------------

// Flat indices to check: the last few, many past 2^31, a few below.
std::vector<int64_t> positions_to_check(int64_t n, uint64_t seed) {
  std::vector<int64_t> at;
  for (int64_t i = n - 8; i < n; ++i) at.push_back(i);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> high(int64_t{1} << 31, n - 1), low(0, (int64_t{1} << 31) - 1);
  for (int k = 0; k < 40; ++k) at.push_back(high(rng));
  for (int k = 0; k < 8; ++k) at.push_back(low(rng));
  return at;
}

double element(const Tensor& flat, int64_t i) { return flat.narrow(i, 1).item(); }

// GPU time of the work `queue` puts on cuda:0's compute stream, in ms, once it has finished.
template <class F>
double gpu_ms(const char* what, F&& queue) {
  cuda::DeviceGuard device(0);
  cuda::Event start(/*timing=*/true), stop(/*timing=*/true);
  start.record(cuda::compute_stream(0));
  queue();
  stop.record(cuda::compute_stream(0));
  finish_within(0, 60, what);
  return stop.elapsed_ms(start);
}

// n = 2^32 - 2^20 elements: past 2^32 - 2^27, where the uint32_t grid-stride index of the broadcast
// and permute kernels wrapped on its last step (the grid holds 2^27 threads) and each thread went
// round again, some 32,000 passes over the same elements instead of 32. The results stayed right
// (the kernels rewrite the same values), but each kernel took some 1000 times longer: what catches
// it is the time of each op against the same op on half the rows (2^31 - 2^19 elements, below the
// wrap), timed in the same run, so the bound holds on any GPU at any speed: twice the work should
// take about twice the time, and the wrapped loops took some 500 times more. A bf16 broadcast add (8.6 GB), a permute of its result in 2-byte
// units and a u8 broadcast copy, each checked at the last elements and at random ones past 2^31
// against float64.
TEST(CudaGpuDefects, BroadcastAndPermuteIndexPast2To31Elements) {
  SKIP_WITHOUT_GPU();
  size_t free_bytes = 0, total_bytes = 0;
  {
    cuda::DeviceGuard device(0);
    cuda::check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  }
  if (free_bytes < size_t{20} << 30) {
    GTEST_SKIP() << "needs 20 GiB of free device memory (two bf16 tensors of 2^32 - 2^20 elements); cuda:0 has "
                 << (free_bytes >> 30) << " GiB free";
  }
  // Twice the elements may take up to 4 times as long (launch and tail effects); the wrapped
  // loops took hundreds of times as long.
  constexpr double kMaxRatio = 4;
  constexpr int64_t R = 65536, C = 65520, n = R * C;  // 2^32 - 2^20
  constexpr int64_t kRun = 5, J = C / kRun;          // permuted runs of 5 bf16 (10 bytes: 2-byte units)
  const Tensor a = testing::random_tensor({R, 1}, DType::bf16, 71);
  const Tensor b = testing::random_tensor({1, C}, DType::bf16, 72);
  const std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>();
  const std::vector<int64_t> at = positions_to_check(n, 7);
  {
    const Tensor a_gpu = a.to(kGpu), b_gpu = b.to(kGpu);
    Tensor sum;
    const double add_half_ms = gpu_ms("add [R/2, 1] + [1, C]", [&] { (void)kernels::add(a_gpu.narrow(0, R / 2), b_gpu); });
    const double add_ms = gpu_ms("add [R, 1] + [1, C]", [&] { sum = kernels::add(a_gpu, b_gpu); });  // [R, C]
    EXPECT_LT(add_ms, kMaxRatio * add_half_ms) << "add of " << n << " bf16 elements against half as many";
    const Tensor flat = sum.reshape({n});
    for (int64_t i : at) {
      const double want = av[static_cast<size_t>(i / C)] + bv[static_cast<size_t>(i % C)];
      EXPECT_LE(std::abs(element(flat, i) - want), std::ldexp(std::abs(want), -8)) << "add, element " << i;
    }
    // moved[j, r, k] = sum[r, j·kRun + k]
    Tensor moved;
    const double permute_half_ms = gpu_ms("permute [R/2, J, 5] -> [J, R/2, 5]", [&] {
      (void)kernels::permute(sum.narrow(0, R / 2).reshape({R / 2, J, kRun}), {1, 0, 2});
    });
    const double permute_ms = gpu_ms("permute [R, J, 5] -> [J, R, 5]", [&] {
      moved = kernels::permute(sum.reshape({R, J, kRun}), {1, 0, 2}).reshape({n});
    });
    EXPECT_LT(permute_ms, kMaxRatio * permute_half_ms) << "permute of " << n << " bf16 elements against half as many";
    for (int64_t p : at) {
      const int64_t j = p / (R * kRun), r = (p / kRun) % R, k = p % kRun, c = j * kRun + k;
      const double want = av[static_cast<size_t>(r)] + bv[static_cast<size_t>(c)];
      EXPECT_EQ(element(moved, p), element(flat, r * C + c)) << "permute, element " << p;
      EXPECT_LE(std::abs(element(moved, p) - want), std::ldexp(std::abs(want), -8)) << "permute, element " << p;
    }
  }
  const Tensor row = testing::uniform_tensor({1, C}, 0, 255, DType::u8, 73);
  const std::vector<double> rv = row.to_vector<double>();
  const Tensor row_gpu = row.to(kGpu);
  Tensor wide;
  const double broadcast_half_ms = gpu_ms("broadcast_to [1, C] -> [R/2, C] (u8)", [&] {
    (void)kernels::broadcast_to(row_gpu, {R / 2, C});
  });
  const double broadcast_ms = gpu_ms("broadcast_to [1, C] -> [R, C] (u8)", [&] {
    wide = kernels::broadcast_to(row_gpu, {R, C}).reshape({n});
  });
  EXPECT_LT(broadcast_ms, kMaxRatio * broadcast_half_ms) << "broadcast_to of " << n << " u8 elements against half as many";
  for (int64_t i : at) EXPECT_EQ(element(wide, i), rv[static_cast<size_t>(i % C)]) << "broadcast_to, element " << i;
}

}  // namespace
}  // namespace octet
