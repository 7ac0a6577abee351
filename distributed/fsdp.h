#pragma once
// FullyShardedDataParallel: each rank keeps 1/N of every parameter (as fp32 master weights), of its
// gradient and of the optimizer state, and gathers a unit of the model only while that unit computes.
//
//   auto group = distributed::init_process_group(device);
//   distributed::FullyShardedDataParallel fsdp(model, group);      // each TransformerBlock a unit
//   optim::AdamW optimizer(fsdp.parameters(), lr);                  // the shards this rank owns
//   loss = criterion(fsdp(x), y); loss.backward();                  // gradients land in the shards
//   fsdp.clip_grad_norm_(1.0); optimizer.step(); optimizer.zero_grad();
//
// Units. The wrap policy, a predicate, picks modules (each nn::TransformerBlock by default); every
// parameter not inside one belongs to the root unit. A unit's parameters are concatenated into flat parameters
// (one per flat_param_key, e.g. decayed or not), each padded to a multiple of the world size N.
// Rank r owns the contiguous fp32 shard r of each flat parameter: a leaf tensor the optimizer steps.
// Frozen parameters (requires_grad false: a LoRA base) go to flat parameters of their own, which are
// sharded and gathered like the others but get no gradient and no optimizer state.
//
// A step, for a unit under FULL_SHARD:
//   forward   pre-hook: all-gather the shards (in compute_dtype) into the unit's gathered buffer,
//             which the module's parameters view; start the next unit's gather (forward prefetch);
//             post-hook: free the gathered buffer.
//   backward  when the gradient of the unit's output arrives: gather it again, and start the next
//             unit's gather (BackwardPre). When every parameter's gradient is in: reduce-scatter the
//             flat gradient (average, reduce_dtype) into this rank's shard, adding to its .grad (so
//             micro-batches accumulate), and free the full gradients (BackwardPost prefetches here).
//             When the gradient of the unit's input is complete, every node of its backward has run:
//             free the gathered buffer.
// SHARD_GRAD_OP keeps the gathered buffer from forward to backward; NO_SHARD keeps everything on
// every rank and all-reduces gradients, which is DDP. HYBRID_SHARD (for jobs over several nodes) is
// FULL_SHARD within each shard group of G consecutive ranks (one node; shard_group_size), with N
// above meaning G; each reduce-scattered gradient shard is then all-reduced (average) across the
// N / G ranks holding the same shard, one per node (distributed/fsdp_hybrid.h has the groups).
// HYBRID_SHARD_GRAD_OP (PyTorch's _HYBRID_SHARD_ZERO2) is SHARD_GRAD_OP within the shard group, with
// the same replicas: a unit stays gathered from its forward to its backward, one gather per step.
// The root unit stays gathered from the start of forward to the end of backward, as in PyTorch; at
// most limit_all_gathers other units are gathered at once. Freeing releases the storage in place
// (Storage::release), so views the autograd graph saved stay valid handles and see the data again
// once it is re-gathered.
//
// FP8 all-gather (fp8_all_gather). Under FP8 training a Linear's GEMMs read its weight as E4M3 bytes
// with a per-tensor scale, so gathering it in bf16 moves twice the bytes the GEMM needs. Instead:
//   layout    the weights of Linears that will run in FP8 (fp8_allowed, both dims multiples of 16) go
//             to flat parameters of their own (FlatParameterInfo::fp8). A block's weights are exactly
//             its decayed parameters, so with a decay/no-decay flat_param_key the layout, and so the
//             checkpoints, are the same with and without this option.
//   per step  once per change of the weights (an optimizer step or a load writes the master shards,
//             which bumps their Storage::version), at the start of the first forward inside an FP8
//             scope: each rank measures the amax of its piece of every FP8 weight (of the shard
//             rounded to compute_dtype, as the Linear would see the gathered weight), one
//             all_reduce(MAX) of those few floats gives every weight's true amax, and
//             nn::record_weight_amax sets the scales from it, the function the Linear's own cast
//             calls (delayed: the history's scale, the amax recorded in its row 0; current: the
//             scale from that amax). Each rank then casts its shard to E4M3, each weight's piece
//             with that weight's scale, and keeps it until the shards change.
//   gather    the unit's FP8 flats are all-gathered as bytes. Once gathered, each weight's transpose
//             (what the backward GEMM reads) is made from the gathered bytes, and each Linear is
//             handed views of both, with the scale_inv, as its weight cast
//             (nn::Fp8WeightCache::supply). The GEMMs read the gathered bytes directly:
//             nothing is decoded and re-quantised, and the bytes equal those the Linear would have
//             cast from a bf16-gathered weight, so training is bit for bit the same, with half the
//             gather bytes for those weights. The views are released and re-gathered like the
//             bf16 buffer; backward re-gathers the same bytes (the scales stay those the shards
//             were cast with).
// A forward outside an FP8 scope (evaluation) gathers those weights in compute_dtype as usual. While
// an FP8 pass is under way the FP8 Linears' weight parameters hold no data: code that reads them (not
// the Linear's FP8 GEMMs) must run outside the FP8 scope.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "distributed/process_group.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "optim/clip_grad.h"
#include "optim/optimizer.h"

namespace octet::distributed {

enum class ShardingStrategy { FullShard, ShardGradOp, NoShard, HybridShard, HybridShardGradOp };
// HybridShard or HybridShardGradOp: sharded within shard groups, replicated across them.
inline bool is_hybrid(ShardingStrategy s) {
  return s == ShardingStrategy::HybridShard || s == ShardingStrategy::HybridShardGradOp;
}
// Which modules become units, by dotted name and module.
using WrapPolicy = std::function<bool(const std::string& name, const nn::Module& module)>;
// Every module of type M becomes a unit (PyTorch's ModuleWrapPolicy).
template <class M>
WrapPolicy wrap_modules_of_type() {
  return [](const std::string&, const nn::Module& module) { return dynamic_cast<const M*>(&module) != nullptr; };
}
enum class BackwardPrefetch { BackwardPre, BackwardPost };
// "full", "grad-op", "none", "hybrid", "hybrid-grad-op"
ShardingStrategy parse_sharding(const std::string& name);

struct FsdpOptions {
  ShardingStrategy sharding = ShardingStrategy::FullShard;
  // HybridShard(GradOp): the ranks that shard among themselves, G (consecutive ranks: one node). The group's
  // size must be a multiple of G. 0: the ranks of one node (launch_info().local_world_size).
  int shard_group_size = 0;
  WrapPolicy wrap_policy = wrap_modules_of_type<nn::TransformerBlock>();
  // Parameters with different keys go to different flat parameters of their unit, so an optimizer
  // can treat them differently (weight decay or not). Default: one flat parameter per unit.
  std::function<int(const std::string& name, const Tensor& parameter)> flat_param_key = nullptr;
  DType compute_dtype = DType::f32;  // gathered parameters and compute: f32 or bf16
  DType reduce_dtype = DType::f32;   // gradients are reduce-scattered in this: f32 or bf16
  BackwardPrefetch backward_prefetch = BackwardPrefetch::BackwardPre;
  bool forward_prefetch = true;
  int limit_all_gathers = 2;  // non-root units gathered at once, and reduce-scatters in flight, at most
  // Inside an enabled nn::Fp8Autocast scope, gather the weights of the Linears that run in FP8 as
  // E4M3 bytes (see "FP8 all-gather" above): half of bf16's all-gather traffic for those weights.
  bool fp8_all_gather = false;
};

class FullyShardedDataParallel {
 public:
  FullyShardedDataParallel(std::shared_ptr<nn::Module> module, std::shared_ptr<ProcessGroup> group,
                           FsdpOptions options = {});
  ~FullyShardedDataParallel();
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  Tensor operator()(const Tensor& input) { return (*module_)(input); }
  nn::Module& module() { return *module_; }
  const std::shared_ptr<ProcessGroup>& process_group() const { return group_; }
  // The ranks this one shards with: process_group() itself, but under HybridShard its shard group.
  const std::shared_ptr<ProcessGroup>& shard_group() const;
  // Under HybridShard, the ranks that hold the same shards as this one (one per shard group); null
  // under the other strategies.
  const std::shared_ptr<ProcessGroup>& replicate_group() const;

  // This rank's fp32 shards of the trainable flat parameters, in flat_parameters() order: give
  // these to the optimizer.
  std::vector<Tensor> parameters() const;
  // The shard of every flat parameter, frozen ones included (for checkpoints).
  std::vector<Tensor> all_shards() const;

  struct FlatParameterInfo {
    std::string unit;  // "" for the root, else the module's dotted name
    int key = 0;
    bool trainable = true;
    bool fp8 = false;  // the weights of FP8 Linears, gathered as E4M3 in FP8 passes (fp8_all_gather)
    std::vector<std::string> parameters;  // dotted names, in the flat order
    std::vector<int64_t> offsets;         // each parameter's first element in the flat
    int64_t numel = 0, padded_numel = 0, shard_numel = 0;
  };
  std::vector<FlatParameterInfo> flat_parameters() const;

  // torch.nn.utils.clip_grad_norm_ over the whole model: the squared norms of every rank's shards
  // are summed over the ranks (over the shard group: replicas hold the same shards), so the result
  // equals the unsharded model's clip. The norm, the
  // all-reduce of the squares and the scaling stay on the shards' device (optim/clip_grad.h): the
  // returned norm is read on the host only when it is converted to double.
  optim::GradNorm clip_grad_norm_(double max_norm);

  // Every parameter at full size in f32, by dotted name in the module's registration order,
  // gathered from all ranks' shards (from the shard group's; a collective: every rank must call it).
  std::vector<std::pair<std::string, Tensor>> full_parameters();
  // One parameter at full size in f32, by dotted name: its flat alone is gathered (a collective on
  // the shard group, as above). For code that needs a weight outside its unit's gathered window, or
  // in FP8 passes under fp8_all_gather, where the Linears' weights hold no data.
  Tensor full_parameter(const std::string& name);

  int units_gathered() const;      // non-root units gathered now
  int max_units_gathered() const;  // the most at once since construction

  // What this rank holds, in bytes. parameters: the fp32 shards; gradients: their .grad;
  // optimizer: the optimizer's per-element state of the shards (AdamW's two moments; scalar step
  // counters are not counted); gathered: the gathered units' buffers now; peak_gathered: the most
  // gathered-buffer bytes at once (units plus gradients in flight) since construction.
  // fp8_weight_casts: FP8 copies of weights that the FP8 Linears cache for themselves (their weight
  // cast: E4M3 data and transpose, about 2 bytes per weight element of the whole model, kept across
  // the step because backward and later micro-batches reuse them) when the units are gathered in bf16
  // under FP8 training; 0 with fp8_all_gather, where those casts are views of the gathered buffers.
  // fp8_shard_casts: with fp8_all_gather, this rank's E4M3 casts of its shards of the FP8 weights (1
  // byte per shard element), made at the first FP8 forward after the shards change and kept until
  // the next change.
  struct MemoryLedger {
    int64_t parameters = 0, gradients = 0, optimizer = 0, gathered = 0, peak_gathered = 0, fp8_weight_casts = 0,
            fp8_shard_casts = 0;
    int64_t sharded_total() const { return parameters + gradients + optimizer; }
  };
  MemoryLedger memory_ledger(const optim::Optimizer* optimizer = nullptr) const;

  struct State;

 private:
  std::shared_ptr<nn::Module> module_;
  std::shared_ptr<ProcessGroup> group_;
  std::shared_ptr<State> state_;
};

// optim::weight_decay_groups for a sharded model: this rank's shards of the trainable flat parameters
// in two groups, those of key 0 (no decay) first, then key 1 (weight_decay), empty groups left out.
// Build the FSDP with FsdpOptions::flat_param_key = optim::is_weight_decayed (as int), so that no
// flat mixes decayed and undecayed parameters.
std::vector<optim::ParamGroup> weight_decay_groups(const FullyShardedDataParallel& fsdp, double lr,
                                                   double weight_decay);

}  // namespace octet::distributed
