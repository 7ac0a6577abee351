// A bf16 training step on the GPU queues its work and returns without waiting for the device, checked
// two ways that fail on a host sync:
//   - core/host_sync.h's count (item, copies with a host side, stream and event synchronizes, cudaFree)
//     does not move during the steps between log steps, and moves on a log step;
//   - the step runs while a kernel holds the compute stream until the host lets it go. A step that
//     waited for the device (for a value, a stream, an event) would wait behind that kernel: a
//     watchdog lets the kernel go after a bound, and the test fails when it had to. A step that did
//     not wait returns at once, with its work still queued behind the kernel (cudaStreamQuery).
// Also on the GPU: the clip and the DropPath mask against the CPU, and the device prefetcher, whose
// next() does not wait for the GPU either and passes its worker's errors on.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "apps/parallel.h"
#include "apps/run_options.h"
#include "apps/train_report.h"
#include "apps/train_step.h"
#include "core/cuda_stream.h"
#include "core/host_sync.h"
#include "core/random.h"
#include "data/dataset.h"
#include "data/device_prefetcher.h"
#include "data/loader.h"
#include "data/synthetic.h"
#include "kernels/optimizers.h"
#include "kernels/random_masks.h"
#include "models/vit.h"
#include "optim/optim.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/cuda/small_vit.h"
#include "tests/testing.h"

namespace octet {
namespace {

using testing::kGpu;
using testing::same_bits;

// Spins until the host sets *go (mapped pinned memory), or about `max_cycles` clock cycles pass (a
// bound that only keeps a broken test from hanging the GPU for good).
__global__ void hold_until_released(const volatile int* go, long long max_cycles) {
  const long long start = clock64();
  while (*go == 0 && clock64() - start < max_cycles) __nanosleep(1000);
}

// What happened while the compute stream was held.
struct Held {
  bool returned_while_held = false;  // the host work returned before the watchdog let the stream go
  bool work_still_queued = false;    // and the stream still had work queued behind the holding kernel
};

// Holds cuda:0's compute stream with hold_until_released, runs `host_work` on this thread, then lets
// the stream go and waits for it. A watchdog thread lets it go after `limit` if host_work has not
// returned by then: host_work was waiting for the device.
Held while_the_stream_is_held(const std::function<void()>& host_work, std::chrono::seconds limit) {
  int* flag = nullptr;
  int* device_flag = nullptr;
  octet::cuda::check(cudaHostAlloc(reinterpret_cast<void**>(&flag), sizeof(int), cudaHostAllocMapped), "cudaHostAlloc");
  *static_cast<volatile int*>(flag) = 0;
  octet::cuda::check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_flag), flag, 0),
                     "cudaHostGetDevicePointer");
  const cudaStream_t compute = octet::cuda::compute_stream(0);
  hold_until_released<<<1, 1, 0, compute>>>(device_flag, 200'000'000'000LL);
  octet::cuda::check(cudaGetLastError(), "hold_until_released");

  std::mutex mutex;
  std::condition_variable done_changed;
  bool done = false, released_by_watchdog = false;
  auto release = [&] { *static_cast<volatile int*>(flag) = 1; };
  std::thread watchdog([&] {
    std::unique_lock lock(mutex);
    if (!done_changed.wait_for(lock, limit, [&] { return done; })) {
      released_by_watchdog = true;
      release();
    }
  });
  Held held;
  std::exception_ptr failed;
  try {
    host_work();
    held.work_still_queued = cudaStreamQuery(compute) == cudaErrorNotReady;  // a query, not a wait
  } catch (...) {
    failed = std::current_exception();
  }
  {
    std::lock_guard lock(mutex);
    done = true;
    held.returned_while_held = !released_by_watchdog;
  }
  done_changed.notify_all();
  watchdog.join();
  release();
  cudaStreamSynchronize(compute);
  cudaFreeHost(flag);
  if (failed) std::rethrow_exception(failed);
  return held;
}

// train_vit's step and report (apps/) around the small ViT in bf16 on the GPU, with a clip that
// binds, dropout and DropPath. One micro-batch per step (the CPU test covers accumulation): a step of
// this 2-block model is a few hundred launches, well below the depth at which queueing a launch behind
// the held stream would itself block the host.
struct GpuRun {
  RunOptions o;
  Generator init{3}, data{4};
  std::shared_ptr<models::VisionTransformer> model;
  std::unique_ptr<ParallelModel> parallel;
  std::unique_ptr<optim::AdamW> optimizer;
  std::unique_ptr<TrainReport> report;
  std::unique_ptr<TrainStep> step;
  Tensor images, labels;  // one batch on the GPU, made before anything is measured

  GpuRun(int64_t log_every, int64_t total_steps) {
    o.device = "cuda:0";
    o.precision = "bf16";
    o.batch_size = 6;
    o.clip_grad = 1e-3;
    o.log_every = log_every;
    models::ViTConfig config = testing::small_vit_config("step_syncs");
    config.drop_rate = 0.1;
    config.drop_path_rate = 0.2;
    model = std::make_shared<models::VisionTransformer>(config, true, &init);
    model->to(kGpu);
    parallel = std::make_unique<ParallelModel>(o, model, nullptr);  // makes the model bf16
    optimizer = std::make_unique<optim::AdamW>(parallel->param_groups(o.lr, o.weight_decay), o.lr);
    report = std::make_unique<TrainReport>(o, *model, *parallel, *optimizer, nullptr, nullptr, 0, total_steps);
    step = std::make_unique<TrainStep>(TrainStep{
        .model = *model,
        .criterion = nn::CrossEntropyLoss(o.label_smoothing),
        .optimizer = *optimizer,
        .backward = [this](const Tensor& loss, bool last) { parallel->backward(loss, last); },
        .clip_grad_norm = [this](double max_norm) { parallel->clip_grad_norm_(max_norm); },
        .grad_accum = o.grad_accum,
        .clip_grad = o.clip_grad});
    images = testing::random_tensor({6, 3, 16, 16}, DType::f32, 21).to(kGpu);
    labels = from_vector(std::vector<int64_t>{3, 1, 4, 1, 5, 9}, {6}, DType::i64, kGpu);
    model->train();
    report->start();
  }

  // Step `step` (from 0) as train_vit takes it.
  void take_step(int64_t at) {
    report->begin_step(at);
    const StepResult result = (*step)([&] { return data::Batch{images, labels, 0, 0}; });
    report->end_step(at + 1, o.lr, result);
  }
};

bool memory_pool_disabled() {
  const char* v = std::getenv("OCTET_NO_CUDA_MEMORY_POOL");
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

TEST(CudaStepSyncs, Bf16StepsBetweenLogStepsNeverWaitForTheGpu) {
  SKIP_WITHOUT_GPU();
  if (memory_pool_disabled()) GTEST_SKIP() << "OCTET_NO_CUDA_MEMORY_POOL is set: every free is a cudaFree, a host wait";
  const int64_t log_every = 100, total_steps = 200;
  GpuRun run(log_every, total_steps);
  // Two steps first: the optimizer makes its state and f32 masters, cuBLASLt its workspace, cuDNN its
  // plans (the first step's one-time setup, apps/train_step.cpp).
  run.take_step(0);
  run.take_step(1);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const host_sync::Counts before = host_sync::counts();
  run.take_step(2);
  run.take_step(3);
  const host_sync::Counts during = host_sync::counts() - before;
  EXPECT_EQ(during.total(), 0) << "two bf16 steps between log steps made host syncs: " << during.describe();

  // One step while the stream is held: it must return with its work still queued.
  const Held held = while_the_stream_is_held([&] { run.take_step(4); }, std::chrono::seconds(30));
  EXPECT_TRUE(held.returned_while_held)
      << "the step did not return while a kernel held the compute stream: it waited for the GPU (a host sync)";
  EXPECT_TRUE(held.work_still_queued) << "the step's work had already run when it returned";

  // A log step reads the losses: the count moves, so this test can see a read.
  const host_sync::Counts before_log = host_sync::counts();
  for (int64_t at = 5; at < log_every; ++at) run.take_step(at);
  EXPECT_GT((host_sync::counts() - before_log).total(), 0) << "the log step read nothing on the host";
}

TEST(CudaStepSyncs, ClipAndDropPathMaskMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  // The DropPath mask: the same bits from the same (seed, offset) on both devices.
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    const Tensor cpu = kernels::keep_mask({1001, 1, 1}, 0.8, 1.25, dtype, Device::cpu(), 7, 13);
    const Tensor gpu = kernels::keep_mask({1001, 1, 1}, 0.8, 1.25, dtype, kGpu, 7, 13);
    EXPECT_TRUE(same_bits(gpu, cpu)) << dtype_name(dtype);
  }
  // The coefficient and the scale, from the same sum of squares: the same bits.
  const Tensor ss = from_vector<double>({12345.678}, {});
  const kernels::ClipScalars cpu_clip = kernels::clip_scalars(ss, 1.0);
  const kernels::ClipScalars gpu_clip = kernels::clip_scalars(ss.to(kGpu), 1.0);
  EXPECT_TRUE(same_bits(gpu_clip.norm, cpu_clip.norm));
  EXPECT_TRUE(same_bits(gpu_clip.coef, cpu_clip.coef));
  std::vector<Tensor> cpu_grads, gpu_grads;
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (int64_t n : {int64_t{3}, int64_t{70000}}) {
      cpu_grads.push_back(testing::random_tensor({n}, dtype, static_cast<uint64_t>(n)));
      gpu_grads.push_back(cpu_grads.back().to(kGpu));
    }
  }
  kernels::scale_multi_(cpu_grads, cpu_clip.coef);
  kernels::scale_multi_(gpu_grads, gpu_clip.coef);
  for (size_t i = 0; i < cpu_grads.size(); ++i) EXPECT_TRUE(same_bits(gpu_grads[i], cpu_grads[i])) << i;

  // clip_grad_norm_ on the GPU: no host sync, the norm of the CPU's within the summation order.
  std::vector<Tensor> cpu_params, gpu_params;
  for (size_t i = 0; i < cpu_grads.size(); ++i) {
    Tensor c = zeros(cpu_grads[i].shape(), cpu_grads[i].dtype());
    Tensor g = c.to(kGpu);
    c.requires_grad_();
    g.requires_grad_();
    c.set_grad(cpu_grads[i].clone());
    g.set_grad(cpu_grads[i].to(kGpu));
    cpu_params.push_back(c);
    gpu_params.push_back(g);
  }
  const host_sync::Counts before = host_sync::counts();
  const optim::GradNorm gpu_norm = optim::clip_grad_norm_(gpu_params, 0.5);
  EXPECT_EQ((host_sync::counts() - before).total(), 0) << (host_sync::counts() - before).describe();
  EXPECT_TRUE(gpu_norm.is_cuda());
  const double cpu_norm = optim::clip_grad_norm_(cpu_params, 0.5);
  EXPECT_NEAR(gpu_norm.value(), cpu_norm, 1e-12 * cpu_norm);
}

// ---- the device prefetcher --------------------------------------------------------------------------------

// 64 images of 3·8·8; item `bad` cannot be read.
class FailingImages : public data::Dataset {
 public:
  explicit FailingImages(int64_t bad) : bad_(bad) {}
  int64_t size() const override { return 64; }
  Shape image_shape() const override { return {3, 8, 8}; }
  int64_t num_classes() const override { return 10; }
  void get(int64_t index, float* image, int64_t* label) const override {
    OCTET_CHECK(index != bad_, "FailingImages: item ", index, " is unreadable");
    for (int64_t i = 0; i < 3 * 8 * 8; ++i) image[i] = static_cast<float>(index);
    *label = index % 10;
  }

 private:
  int64_t bad_;
};

TEST(CudaStepSyncs, PrefetcherPassesOnTheWorkersErrorAtItsBatchAndAgain) {
  SKIP_WITHOUT_GPU();
  // Batches of 8 in order: item 37 is in batch 4.
  data::DataLoader loader(std::make_shared<FailingImages>(37), {.batch_size = 8, .shuffle = false});
  data::DevicePrefetcher prefetcher(loader, kGpu);
  for (int64_t b = 0; b < 4; ++b) {
    const data::Batch batch = prefetcher.next();
    EXPECT_EQ(batch.index, b);
    EXPECT_EQ(batch.labels.to(Device::cpu()).to_vector<int64_t>()[0], (8 * b) % 10);
  }
  EXPECT_TRUE(testing::throws_with([&] { prefetcher.next(); }, {"FailingImages", "item 37"}));
  EXPECT_TRUE(testing::throws_with([&] { prefetcher.next(); }, {"FailingImages", "item 37"}));
  // set_state starts over with a fresh worker.
  prefetcher.set_state({0, 1});
  EXPECT_EQ(prefetcher.state().batch, 1);
  EXPECT_EQ(prefetcher.next().index, 1);
}

TEST(CudaStepSyncs, PrefetcherHandsOutBatchesWithoutWaitingForTheGpu) {
  SKIP_WITHOUT_GPU();
  data::DataLoader loader(data::make_synthetic(160, Shape({3, 32, 32}), 10, 17),
                          {.batch_size = 16, .shuffle = true, .seed = 9});
  data::DevicePrefetcher prefetcher(loader, kGpu);
  prefetcher.next();
  prefetcher.next();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // Its worker holds two pinned buffers: two more batches come out while the GPU is held, with no
  // host sync on this thread (the worker's waits are its own).
  host_sync::Counts during;
  const Held held = while_the_stream_is_held(
      [&] {
        const host_sync::Counts before = host_sync::counts();
        EXPECT_EQ(prefetcher.next().index, 2);
        EXPECT_EQ(prefetcher.next().index, 3);
        during = host_sync::counts() - before;
      },
      std::chrono::seconds(30));
  EXPECT_TRUE(held.returned_while_held) << "next() waited for the GPU";
  EXPECT_EQ(during.total(), 0) << during.describe();
}

}  // namespace
}  // namespace octet
