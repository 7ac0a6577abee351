#include "apps/parallel.h"

#include <fmt/format.h>

#include "distributed/fsdp_hybrid.h"
#include "nn/fp8.h"
#include "optim/optim.h"

namespace octet {

ParallelModel::ParallelModel(const RunOptions& o, std::shared_ptr<models::VisionTransformer> model,
                             std::shared_ptr<distributed::ProcessGroup> group)
    : o_(o), model_(std::move(model)), group_(std::move(group)) {
  const bool low_precision = o.precision == "bf16" || o.precision == "fp8";
  const DType reduce_dtype = dtype_from_name(o.reduce_dtype);
  if (o.parallel == "fsdp") {
    // The shards stay f32 (they are the master weights); units are gathered in bf16.
    fsdp_ = std::make_unique<distributed::FullyShardedDataParallel>(
        model_, group_,
        distributed::FsdpOptions{
            .sharding = distributed::parse_sharding(o.sharding),
            .shard_group_size = o.shard_group_size,
            .flat_param_key = [](const std::string& name, const Tensor& p) { return optim::is_weight_decayed(name, p) ? 1 : 0; },
            .compute_dtype = low_precision ? DType::bf16 : DType::f32,
            .reduce_dtype = reduce_dtype,
            .backward_prefetch = o.fsdp_prefetch == "post" ? distributed::BackwardPrefetch::BackwardPost
                                                           : distributed::BackwardPrefetch::BackwardPre,
            .fp8_all_gather = o.fp8_all_gather});
    return;
  }
  // bf16: the parameters become bf16 (so activations, GEMMs and attention are bf16 throughout) and
  // the optimizer trains them through f32 master copies made from these values on its first step.
  if (low_precision) model_->to(DType::bf16);
  if (o.parallel == "ddp") {
    ddp_ = std::make_unique<distributed::DistributedDataParallel>(
        model_, group_, distributed::DdpOptions{.bucket_cap_mb = o.bucket_cap_mb, .reduce_dtype = reduce_dtype});
  }
}

std::vector<optim::ParamGroup> ParallelModel::param_groups(double lr, double weight_decay) const {
  if (!fsdp_) return optim::weight_decay_groups(model_->named_parameters(), lr, weight_decay);
  return distributed::weight_decay_groups(*fsdp_, lr, weight_decay);
}

void ParallelModel::backward(const Tensor& loss, bool last_micro_batch) {
  if (ddp_ && !last_micro_batch) {
    auto no_sync = ddp_->no_sync();
    loss.backward();
    return;
  }
  loss.backward();  // DDP: returns with the gradients averaged; FSDP: with them in the shards
}

optim::GradNorm ParallelModel::clip_grad_norm_(double max_norm) {
  if (fsdp_) return fsdp_->clip_grad_norm_(max_norm);
  return optim::clip_grad_norm_(model_->parameters(), max_norm);
}

std::vector<std::pair<std::string, Tensor>> ParallelModel::full_parameters() {
  if (fsdp_) return fsdp_->full_parameters();
  return model_->named_parameters();
}

std::string ParallelModel::describe() const {
  if (ddp_) {
    return fmt::format("data parallel over {} ranks ({} backend): gradients in {} buckets all-reduced in {}",
                       group_->size(), group_->backend(), ddp_->buckets().size(), o_.reduce_dtype);
  }
  if (fsdp_) {
    const auto flats = fsdp_->flat_parameters();
    int64_t padded = 0, fp8 = 0;
    for (const auto& f : flats) padded += f.padded_numel, fp8 += f.fp8 ? f.padded_numel : 0;
    const std::string gathered_in = o_.precision == "fp32" ? "f32" : "bf16";
    // Under hybrid sharding, which ranks shard together and which hold the same shards.
    const std::string groups =
        fsdp_->replicate_group() ? fmt::format(": {}, gradient shards all-reduced across each replicate group",
                                               distributed::fsdp::describe(distributed::fsdp::plan_hybrid_groups(
                                                   group_->size(), group_->rank(), fsdp_->shard_group()->size())))
                                 : "";
    return fmt::format("fully sharded over {} ranks ({} backend, sharding {}{}, prefetch {}): {} flat parameters "
                       "({} elements with padding), gathered in {}, gradients reduce-scattered in {}",
                       group_->size(), group_->backend(), o_.sharding, groups, o_.fsdp_prefetch, flats.size(), padded,
                       fp8 > 0 ? fmt::format("e4m3 ({} elements: the FP8 Linears' weights) and {}", fp8, gathered_in)
                               : gathered_in,
                       o_.reduce_dtype);
  }
  return "one process";
}

int64_t ParallelModel::held_bytes() const {
  const int64_t fp8_state = nn::fp8_scaling_bytes(*model_);
  if (fsdp_ == nullptr) return fp8_state + nn::fp8_weight_cast_bytes(*model_);
  const auto l = fsdp_->memory_ledger();
  return fp8_state + l.gathered + l.fp8_weight_casts + l.fp8_shard_casts;
}

namespace {

int shards_per_flat(const distributed::FullyShardedDataParallel& fsdp) {
  const auto flats = fsdp.flat_parameters();
  return flats.empty() ? 1 : static_cast<int>(flats.front().padded_numel / flats.front().shard_numel);
}

}  // namespace

nlohmann::json ParallelModel::ledger(const optim::Optimizer& optimizer) const {
  const auto l = fsdp_->memory_ledger(&optimizer);
  return {{"parameters_bytes", l.parameters}, {"gradients_bytes", l.gradients}, {"optimizer_bytes", l.optimizer},
          {"sharded_total_bytes", l.sharded_total()}, {"gathered_bytes", l.gathered},
          {"peak_gathered_bytes", l.peak_gathered}, {"max_units_gathered", fsdp_->max_units_gathered()},
          {"fp8_weight_casts_bytes", l.fp8_weight_casts}, {"fp8_shard_casts_bytes", l.fp8_shard_casts},
          // The ranks each flat parameter is sharded over: the world, under hybrid sharding G, under
          // --sharding none 1.
          {"shard_group_size", shards_per_flat(*fsdp_)}};
}

}  // namespace octet
