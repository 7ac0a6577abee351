#pragma once
// FSDP's gradient side (internal to distributed/fsdp*.cpp): once every gradient of a flat parameter
// is in, its full gradient is reduce-scattered (average, in reduce_dtype) into this rank's shard and
// added to the shard's .grad, so micro-batches accumulate. Flats are launched in the layout's
// reduce order on every rank (OrderedReducer), and at most `limit` stay in flight: otherwise every
// unit's full gradient would stay until the end of backward, and gradient memory would grow with
// the model instead of with one unit.
//
// HYBRID_SHARD adds a second collective per flat: once its reduce-scatter within the shard group has
// finished, the gradient shard is all-reduced (average) across the replicate group, and only then
// added to .grad. Each rank issues those all-reduces at the same points of its sequence of
// collectives, whatever the timing: flat b's when flat b + limit is launched (or at the end of the
// pass). The full gradient is freed when the all-reduce starts, so the all-reduce holds only the shard.
#include <functional>
#include <vector>

#include "distributed/fsdp_units.h"
#include "distributed/ordered_reducer.h"
#include "distributed/process_group.h"

namespace octet::distributed::fsdp {

class GradientReducer {
 public:
  // `sharded` false (NO_SHARD): an all-reduce of the whole gradient instead. `replicate` (HYBRID_SHARD,
  // else null): the group the gradient shards are then all-reduced across. `unit_reduced(u)` runs
  // when the last flat of unit u has been launched (BackwardPost prefetches there).
  GradientReducer(std::vector<Flat>& flats, const std::vector<Unit>& units, std::vector<int> reduce_order,
                  ProcessGroup& group, ProcessGroup* replicate, bool sharded, DType reduce_dtype, int limit,
                  GatheredBytes& bytes, std::function<void(int unit)> unit_reduced);
  ~GradientReducer();  // lets reduce-scatters in flight finish before their buffers go
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  bool pass_active() const { return order_.pass_active(); }
  void begin_pass();
  // Slot s of flat f has its gradient (the parameter's .grad): launches what is ready.
  void on_gradient(int f, int s);
  // The end of backward: a parameter this pass did not reach contributes zeros (another rank may
  // have used it); launches the rest and waits for every reduce-scatter.
  void finish_pass();

 private:
  struct InFlight {
    Tensor grad_full, grad_shard;  // the collective's input and output
    WorkHandle work;
    bool replicating = false;  // HYBRID_SHARD: `work` is the all-reduce across the replicate group
    int64_t start_us = 0;
  };
  void launch_ready();
  void launch(int f);
  bool awaits_replication(int f) const { return replicate_ != nullptr && !in_flight_[f].replicating; }
  void replicate(int f);  // its reduce-scatter has finished: frees the full gradient, starts the all-reduce
  void wait(int f);
  void finish(int f);  // waits (for both collectives), adds to the shard's .grad, frees the full gradient
  void collect();      // finishes what is done, and the oldest while more than `limit` are in flight

  std::vector<Flat>& flats_;
  const std::vector<Unit>& units_;
  std::vector<int> reduce_order_;  // OrderedReducer bucket b is flat reduce_order_[b]
  ProcessGroup& group_;
  ProcessGroup* replicate_;
  bool sharded_;
  DType reduce_dtype_;
  int limit_;
  GatheredBytes& bytes_;
  std::function<void(int)> unit_reduced_;
  OrderedReducer order_;
  std::vector<int> bucket_of_;     // per flat: its bucket, -1 for a frozen flat
  std::vector<InFlight> in_flight_;  // per flat
  std::vector<bool> launched_;       // per flat, this pass (frozen flats count as launched)
};

}  // namespace octet::distributed::fsdp
