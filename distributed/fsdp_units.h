#pragma once
// What FSDP's roles share at run time (internal to distributed/fsdp*.cpp): the flat parameters and
// units of the layout (distributed/fsdp_layout.h) as tensors and modules, and the two small objects
// the roles report through: the count of gathered bytes (the memory ledger's) and the trace.
//
// The roles: UnitGatherer gathers and frees units and prefetches (fsdp_gather.h); GradientReducer
// reduce-scatters gradients into the shards (fsdp_reduce.h); Fp8AllGather makes the E4M3 shards
// (fsdp_fp8.h); FullyShardedDataParallel orders them from the module hooks (fsdp.cpp).
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "core/trace.h"
#include "distributed/fsdp_fp8.h"
#include "distributed/fsdp_layout.h"
#include "distributed/process_group.h"
#include "nn/layers.h"
#include "nn/module.h"

namespace octet::distributed::fsdp {

struct Slot {
  std::string name;
  Tensor parameter;  // the module's parameter: a view of the flat's gathered buffer
  int64_t offset = 0;
};

struct Flat {
  int unit = 0, key = 0;
  bool trainable = true;
  std::vector<Slot> slots;
  int64_t numel = 0, padded = 0, shard_numel = 0;
  Tensor shard;     // f32 [shard_numel], a leaf: this rank's master weights; .grad its gradient
  Tensor gathered;  // [padded] compute dtype; its storage is released while the unit is sharded
  std::shared_ptr<Fp8Flat> fp8;  // set when every slot is the weight of an FP8 Linear (fp8_all_gather)
};

struct Unit {
  std::string name;  // "" for the root
  std::shared_ptr<nn::Module> module;
  std::vector<int> flats;
  std::string label() const { return name.empty() ? "root" : name; }
};

// Bytes of gathered units and of full gradients waiting for their reduce-scatter: now, and the most
// at once (FullyShardedDataParallel::MemoryLedger::gathered and peak_gathered).
class GatheredBytes {
 public:
  void add(int64_t delta) {
    now_ += delta;
    peak_ = std::max(peak_, now_);
  }
  int64_t now() const { return now_; }
  int64_t peak() const { return peak_; }

 private:
  int64_t now_ = 0, peak_ = 0;
};

// Under fp8_all_gather: the Linears that will run in FP8 (fp8_allowed, dims the FP8 GEMM takes), by
// the name of their weight.
std::map<std::string, std::shared_ptr<nn::Linear>> fp8_linears(nn::Module& module, DType compute_dtype);

// The flat parameter `layout` describes, made from `parameters` (the module's, in registration
// order). Every rank starts from rank 0's values: the flat is broadcast and this rank keeps shard
// `rank` as its f32 master weights. The parameters become views of the flat's gathered buffer,
// which starts released. With `layout.fp8`, its Fp8Flat over the weights of `fp8_weights`.
Flat make_flat(const FlatLayout& layout, const std::vector<nn::NamedTensor>& parameters,
               const std::map<std::string, std::shared_ptr<nn::Linear>>& fp8_weights, ProcessGroup& group, int rank,
               DType compute_dtype);

// FSDP's spans in the per-rank trace (core/trace.h): on the "fsdp" track the collectives from issue
// to ready, on "fsdp wait" the part compute waited for.
struct Trace {
  static bool on() { return trace::enabled(); }
  static int64_t now() { return trace::now_us(); }
  static void span(const std::string& name, bool wait, int64_t start_us, int64_t end_us) {
    trace::complete(name, "fsdp", wait ? "fsdp wait" : "fsdp", start_us, end_us);
  }
};

}  // namespace octet::distributed::fsdp
