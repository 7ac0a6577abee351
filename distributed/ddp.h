#pragma once
// DistributedDataParallel: every rank holds the whole model and trains it on its own shard of the
// batch; averaging the gradients over the ranks makes each step the step one process would take on
// the whole batch.
//
//   auto group = distributed::init_process_group(device);
//   distributed::DistributedDataParallel ddp(model, group);   // broadcasts rank 0's parameters
//   loss = criterion(ddp(x), y);                              // this rank's shard of the batch
//   loss.backward();             // buckets all-reduce while backward goes on; averaged on return
//   optimizer.step();
//
// How the overlap works. The parameters are grouped in buckets, in REVERSE registration order
// (roughly the order backward produces their gradients): the first bucket holds at most
// first_bucket_cap_mb, the others bucket_cap_mb. Each parameter has a post-accumulate gradient hook;
// when it fires, the gradient is copied into its bucket's flat buffer (in reduce_dtype). A bucket
// whose last gradient has arrived is all-reduced (average) at once, asynchronously, so it travels
// while backward computes the earlier layers. Buckets are always launched in bucket order, on every
// rank: a bucket that fills early waits for the ones before it, so ranks whose hooks fire in
// different orders still issue the same collectives in the same order.
//
// At the end of backward (autograd::queue_callback) any bucket holding a parameter that got no
// gradient on this rank is launched with zeros in its place, then every bucket is waited on and
// its averaged values are written back to the parameters' .grad. On a GPU that wait is a stream
// wait: the host goes on queueing the optimizer, whose kernels start as soon as the reductions land.
//
// Gradient accumulation: inside no_sync() the hooks do nothing and gradients accumulate locally;
// the first backward after it reduces the accumulated sum.
#include <memory>
#include <string>
#include <vector>

#include "distributed/process_group.h"
#include "nn/fp8.h"
#include "nn/module.h"

namespace octet::distributed {

struct DdpOptions {
  double bucket_cap_mb = 25.0;       // PyTorch's default
  double first_bucket_cap_mb = 1.0;  // small, so the first all-reduce starts early in backward
  // The dtype gradients are reduced in: f32 (exact averaging of f32 gradients) or bf16 (half the
  // bytes; each pairwise sum rounds to bf16).
  DType reduce_dtype = DType::f32;
  // Whether to broadcast rank 0's parameters and buffers when wrapping (so every rank starts equal).
  bool broadcast_on_wrap = true;
  // false holds every bucket back until backward has finished, then reduces them all: the same
  // result with no overlap, to measure what the overlap hides (bench/bench_ddp.cpp).
  bool overlap = true;
};

class DistributedDataParallel {
 public:
  DistributedDataParallel(std::shared_ptr<nn::Module> module, std::shared_ptr<ProcessGroup> group,
                          DdpOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // The wrapped module's forward (its hooks run).
  Tensor operator()(const Tensor& input) { return (*module_)(input); }
  nn::Module& module() { return *module_; }
  const std::shared_ptr<ProcessGroup>& process_group() const { return group_; }

  // While the guard lives, backward passes accumulate gradients locally without communicating.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  struct BucketInfo {
    std::vector<std::string> parameters;  // names, in the order their gradients sit in the bucket
    int64_t numel = 0;
    size_t bytes = 0;  // in reduce_dtype
  };
  std::vector<BucketInfo> buckets() const;

  // Launches the remaining buckets and writes the averaged gradients back. Runs by itself at the
  // end of every synchronised backward; call it only when driving autograd by hand without it.
  void finalize_backward();

  struct State;  // buckets, slots and the current pass

 private:
  std::shared_ptr<nn::Module> module_;
  std::shared_ptr<ProcessGroup> group_;
  std::shared_ptr<State> state_;  // shared with the gradient hooks, which hold it weakly
};

// For nn::Fp8Autocast under data parallelism: the amaxes max-reduced over `group`'s ranks, so every
// rank derives the same FP8 scales (Transformer Engine's amax reduction).
nn::AmaxReducer fp8_amax_reducer(std::shared_ptr<ProcessGroup> group);

}  // namespace octet::distributed
