// Data-parallel training against Octet's C++ API: a Vision Transformer learns Fashion-MNIST on every
// rank of an mpirun job, with DDP (each rank holds the whole model) or FSDP (each rank holds 1/N of
// the parameters, gradients and optimizer state). minimal_train.cpp is the one-process version.
//
//   mpirun -np 4 build/bin/distributed_train ddp [steps]     (default: one epoch)
//   mpirun -np 4 build/bin/distributed_train fsdp [steps]
//
// Each rank takes its local rank's GPU and trains in bf16, the optimizer keeping f32 master weights;
// the ranks reduce over NCCL. Without a GPU each rank trains in f32 on the CPU and the ranks reduce
// over MPI. Run without mpirun it is one rank. A rank that throws ends the whole job.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "autograd/grad_mode.h"
#include "core/device.h"
#include "core/error.h"
#include "data/fashion_mnist.h"
#include "data/loader.h"
#include "distributed/ddp.h"
#include "distributed/fsdp.h"
#include "distributed/launch.h"
#include "kernels/reduce.h"
#include "kernels/threads.h"
#include "models/vit.h"
#include "nn/layers.h"
#include "optim/optim.h"
#include "optim/param_groups.h"

using namespace octet;

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "ddp";
  if (mode != "ddp" && mode != "fsdp") {
    std::fprintf(stderr, "usage: distributed_train ddp|fsdp [steps]\n");
    return 2;
  }
  return distributed::run_rank_main([&] {
    const distributed::LaunchInfo launch = distributed::launch_info();
    const Device device = cuda::is_available() ? Device::cuda(launch.local_rank) : Device::cpu();
    OCTET_CHECK(device.is_cpu() || launch.local_rank < cuda::device_count(), "local rank ", launch.local_rank,
                " needs GPU cuda:", launch.local_rank, " but this node has ", cuda::device_count(),
                "; start at most that many ranks per node");
    // On the CPU the ranks of a node share its cores.
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    kernels::set_num_threads(std::max(1, cores / launch.local_world_size));
    const std::shared_ptr<distributed::ProcessGroup> group = distributed::init_process_group(device);
    const int rank = group->rank(), world = group->size();

    // Each rank reads its own 128 images of every global batch of world × 128.
    data::DataLoader train(data::load_fashion_mnist("", /*train=*/true),
                           {.batch_size = 128, .shuffle = true, .seed = 0, .rank = rank, .world_size = world});
    const int64_t steps = argc > 2 ? std::stoll(argv[2]) : train.batches_per_epoch();

    manual_seed(0);  // the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    auto model = std::make_shared<models::VisionTransformer>(models::vit_config("vit_fashion_mnist"));
    model->to(device);
    const bool bf16 = device.is_cuda();
    // Weight decay 0.05 on the weights, none on norms, biases, pos_embed and cls_token, as in
    // minimal_train (optim::is_weight_decayed is the rule).
    std::unique_ptr<distributed::DistributedDataParallel> ddp;
    std::unique_ptr<distributed::FullyShardedDataParallel> fsdp;
    std::vector<optim::ParamGroup> groups;
    if (mode == "ddp") {
      if (bf16) model->to(DType::bf16);  // the optimizer trains bf16 parameters through f32 masters
      ddp = std::make_unique<distributed::DistributedDataParallel>(model, group);
      groups = optim::weight_decay_groups(model->named_parameters(), 1e-3, 0.05);
    } else {
      // The shards are f32 (the master weights); each block is gathered in bf16 only to compute.
      // Decayed and undecayed parameters go to flat parameters of their own (key 1 and 0), so that
      // this rank's shards of each can join the right group.
      fsdp = std::make_unique<distributed::FullyShardedDataParallel>(
          model, group,
          distributed::FsdpOptions{
              .flat_param_key = [](const std::string& name, const Tensor& p) -> int {
                return optim::is_weight_decayed(name, p);
              },
              .compute_dtype = bf16 ? DType::bf16 : DType::f32});
      groups = distributed::weight_decay_groups(*fsdp, 1e-3, 0.05);
    }
    optim::AdamW optimizer(groups, 1e-3);
    nn::CrossEntropyLoss criterion(/*label_smoothing=*/0.1);

    for (int64_t step = 1; step <= steps; ++step) {
      const data::Batch batch = train.next();
      const Tensor loss = criterion((*model)(batch.images.to(device)), batch.labels.to(device));
      loss.backward();  // returns with the gradients averaged over the ranks (DDP) or in the shards (FSDP)
      optimizer.step();
      optimizer.zero_grad();
      if (step % 50 == 0 || step == steps) {
        const Tensor mean = loss.detach().clone();  // every rank's loss, averaged: the whole batch's
        group->all_reduce(mean, distributed::ReduceOp::Avg)->wait();
        const double value = mean.item();
        if (rank == 0) std::printf("step %4lld  loss %.4f\n", static_cast<long long>(step), value);
      }
    }

    // Test accuracy: each rank counts its share of the test set, and the counts are summed. Under
    // FSDP every forward gathers parameters with all ranks, so a rank whose last batch is empty
    // still runs one, on a blank image.
    NoGradGuard no_grad;
    model->eval();
    data::DataLoader test(data::load_fashion_mnist("", /*train=*/false),
                          {.batch_size = 500, .shuffle = false, .drop_last = false, .rank = rank, .world_size = world});
    double correct = 0, seen = 0;
    for (int64_t b = 0; b < test.batches_per_epoch(); ++b) {
      const data::Batch batch = test.next();
      if (batch.labels.numel() == 0) {
        if (fsdp) (*model)(zeros({1, 1, 28, 28}, DType::f32, device));
        continue;
      }
      const Tensor predicted = kernels::max((*model)(batch.images.to(device)).to(Device::cpu()), 1).indices;
      for (int64_t i = 0; i < batch.labels.numel(); ++i) {
        correct += predicted.data<int64_t>()[i] == batch.labels.data<int64_t>()[i];
      }
      seen += static_cast<double>(batch.labels.numel());
    }
    const Tensor counts = from_vector<double>({correct, seen}, {2}).to(device);
    group->all_reduce(counts, distributed::ReduceOp::Sum)->wait();
    const std::vector<double> c = counts.to_vector<double>();
    if (rank == 0) {
      std::printf("test accuracy %.2f%% over %.0f images, %d rank(s), %s\n", 100.0 * c[0] / c[1], c[1], world,
                  mode.c_str());
    }
    return 0;
  });
}
