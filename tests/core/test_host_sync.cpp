// The host-sync counter (core/host_sync.h): what counts, once per call, and the two exemptions.
#include "core/host_sync.h"

#include <gtest/gtest.h>

#include <thread>

#include "core/tensor.h"

namespace octet {
namespace {

host_sync::Counts since(const host_sync::Counts& before) { return host_sync::counts() - before; }

TEST(HostSync, ItemAndToVectorCountOnTheCpuOncePerCall) {
  const Tensor t = full({3}, 2.0);
  host_sync::Counts before = host_sync::counts();
  EXPECT_EQ(t.narrow(0, 1).item(), 2.0);
  EXPECT_EQ(since(before).of(host_sync::Kind::item), 1);
  EXPECT_EQ(since(before).total(), 1);

  before = host_sync::counts();
  t.to_vector<float>();  // converts through to(dtype) and to(device) inside: still one read
  t.to_vector<double>();
  EXPECT_EQ(since(before).of(host_sync::Kind::to_vector), 2);
  EXPECT_EQ(since(before).total(), 2);
  EXPECT_EQ(since(before).describe(), "2 to_vector");
  EXPECT_EQ(host_sync::Counts{}.describe(), "none");

  // Copies, fills and conversions read nothing on the host.
  before = host_sync::counts();
  const Tensor c = t.clone();
  c.fill_(3.0);
  c.copy_(t);
  t.to(DType::bf16);
  EXPECT_EQ(since(before).total(), 0) << since(before).describe();
}

TEST(HostSync, CpuKernelScopeExemptsCpuReadsOnly) {
  const Tensor t = full({1}, 1.0);
  const host_sync::Counts before = host_sync::counts();
  {
    const host_sync::CpuKernelScope kernel;
    t.item();
    t.to_vector<double>();
  }
  EXPECT_EQ(since(before).total(), 0);
  {
    // A GPU read is a GPU read everywhere (counted here as if it were one).
    const host_sync::CpuKernelScope kernel;
    const host_sync::Scope gpu_read(host_sync::Kind::device_to_host, /*cpu_tensor=*/false);
  }
  EXPECT_EQ(since(before).of(host_sync::Kind::device_to_host), 1);
  t.item();  // the scope has ended
  EXPECT_EQ(since(before).of(host_sync::Kind::item), 1);
}

TEST(HostSync, HelperThreadsAreNotCountedButOtherThreadsAre) {
  const Tensor t = full({1}, 1.0);
  const host_sync::Counts before = host_sync::counts();
  std::thread([&] {
    const host_sync::HelperThreadScope helper;
    t.item();
    const host_sync::Scope wait(host_sync::Kind::synchronize);
  }).join();
  EXPECT_EQ(since(before).total(), 0);
  std::thread([&] { t.item(); }).join();  // the count is process-wide
  EXPECT_EQ(since(before).of(host_sync::Kind::item), 1);
}

}  // namespace
}  // namespace octet
