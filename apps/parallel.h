#pragma once
// How train_vit spreads its model over the ranks (--parallel none|ddp|fsdp), behind the few calls
// its step makes: the parameters the optimizer steps, the backward of a micro-batch, the global
// gradient clip, and what to log.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/run_options.h"
#include "distributed/ddp.h"
#include "distributed/fsdp.h"
#include "models/vit.h"
#include "optim/clip_grad.h"
#include "optim/optimizer.h"

namespace octet {

class ParallelModel {
 public:
  // `model` is on its device in f32. --precision bf16/fp8 makes it bf16 here (DDP, none), or makes
  // bf16 the dtype FSDP gathers its f32 shards in. `group` is null for --parallel none.
  ParallelModel(const RunOptions& o, std::shared_ptr<models::VisionTransformer> model,
                std::shared_ptr<distributed::ProcessGroup> group);

  // What the optimizer steps, split into timm's weight-decay groups: the model's parameters, or
  // under FSDP this rank's shards (decayed and not-decayed parameters are in separate flats).
  std::vector<optim::ParamGroup> param_groups(double lr, double weight_decay) const;
  // Backward of one micro-batch's loss; under DDP only the last micro-batch of a step all-reduces.
  void backward(const Tensor& loss, bool last_micro_batch);
  // The global gradient-norm clip (over every rank's shards under FSDP), on the gradients' device:
  // the norm is read on the host only if the caller converts it to double.
  optim::GradNorm clip_grad_norm_(double max_norm);

  // Every parameter at full size by name: the model's own, or gathered from the shards under FSDP
  // (a collective there: every rank calls it).
  std::vector<std::pair<std::string, Tensor>> full_parameters();

  // Bytes a forward may allocate that are not activations: FSDP's gathered units, the FP8 Linears'
  // weight casts and scaling state (TrainStep::held_bytes, for the saved-activation figure).
  int64_t held_bytes() const;

  std::string describe() const;  // one log line
  // Under FSDP: this rank's memory ledger, logged and written to the metrics.
  bool has_ledger() const { return fsdp_ != nullptr; }
  nlohmann::json ledger(const optim::Optimizer& optimizer) const;

  distributed::FullyShardedDataParallel* fsdp() { return fsdp_.get(); }

 private:
  const RunOptions& o_;
  std::shared_ptr<models::VisionTransformer> model_;
  std::shared_ptr<distributed::ProcessGroup> group_;
  std::unique_ptr<distributed::DistributedDataParallel> ddp_;
  std::unique_ptr<distributed::FullyShardedDataParallel> fsdp_;
};

}  // namespace octet
