// FSDP's reduce-scatter of gradients into the shards (distributed/fsdp_reduce.h).
#include "distributed/fsdp_reduce.h"

#include <algorithm>
#include <utility>

#include "kernels/elementwise.h"

namespace octet::distributed::fsdp {

namespace {

std::vector<std::vector<std::string>> slot_names(const std::vector<Flat>& flats, const std::vector<int>& order) {
  std::vector<std::vector<std::string>> names;
  for (int f : order) {
    names.emplace_back();
    for (const Slot& slot : flats[f].slots) names.back().push_back(slot.name);
  }
  return names;
}

}  // namespace

GradientReducer::GradientReducer(std::vector<Flat>& flats, const std::vector<Unit>& units,
                                 std::vector<int> reduce_order, ProcessGroup& group, ProcessGroup* replicate,
                                 bool sharded, DType reduce_dtype, int limit, GatheredBytes& bytes,
                                 std::function<void(int unit)> unit_reduced)
    : flats_(flats), units_(units), reduce_order_(std::move(reduce_order)), group_(group), replicate_(replicate),
      sharded_(sharded), reduce_dtype_(reduce_dtype), limit_(limit), bytes_(bytes),
      unit_reduced_(std::move(unit_reduced)),
      order_(slot_names(flats, reduce_order_), "FullyShardedDataParallel"), bucket_of_(flats.size(), -1),
      in_flight_(flats.size()), launched_(flats.size(), true) {
  for (size_t b = 0; b < reduce_order_.size(); ++b) bucket_of_[reduce_order_[b]] = static_cast<int>(b);
}

GradientReducer::~GradientReducer() {
  for (InFlight& r : in_flight_) {
    if (r.work) synchronize_in_destructor(*r.work, "FullyShardedDataParallel (a gradient reduce-scatter)");
  }
}

void GradientReducer::begin_pass() {
  order_.begin_pass();
  for (size_t f = 0; f < flats_.size(); ++f) launched_[f] = !flats_[f].trainable;
}

void GradientReducer::on_gradient(int f, int s) {
  order_.arrive(bucket_of_[f], s);
  launch_ready();
}

void GradientReducer::launch_ready() {
  for (int b : order_.take_ready()) {
    launch(reduce_order_[b]);
    collect();
  }
}

void GradientReducer::launch(int f) {
  Flat& flat = flats_[f];
  InFlight& r = in_flight_[f];
  r.grad_full = zeros({flat.padded}, reduce_dtype_, flat.shard.device());
  for (Slot& slot : flat.slots) {
    if (slot.parameter.grad().defined()) {
      r.grad_full.narrow(slot.offset, slot.parameter.numel()).copy_(slot.parameter.grad().flatten());
      slot.parameter.set_grad(Tensor());  // the full gradient is not kept
    }
  }
  r.grad_shard = empty({flat.shard_numel}, reduce_dtype_, flat.shard.device());
  r.start_us = Trace::now();
  r.replicating = false;
  bytes_.add(static_cast<int64_t>(r.grad_full.nbytes()));
  if (sharded_) {
    r.work = group_.reduce_scatter(r.grad_shard, r.grad_full, ReduceOp::Avg);
  } else {
    r.work = group_.all_reduce(r.grad_full, ReduceOp::Avg);
    r.grad_shard = r.grad_full;
  }
  launched_[f] = true;
  const std::vector<int>& unit = units_[flat.unit].flats;
  if (std::all_of(unit.begin(), unit.end(), [&](int g) { return launched_[g]; })) unit_reduced_(flat.unit);
}

void GradientReducer::wait(int f) {
  InFlight& r = in_flight_[f];
  const bool waiting = !r.work->is_completed();
  const int64_t wait_start = Trace::now();
  r.work->wait();
  r.work.reset();
  if (waiting && Trace::on()) {
    Trace::span("wait reduce_scatter " + units_[flats_[f].unit].label(), true, wait_start, Trace::now());
  }
}

void GradientReducer::replicate(int f) {
  InFlight& r = in_flight_[f];
  wait(f);
  bytes_.add(-static_cast<int64_t>(r.grad_full.nbytes()));
  r.grad_full = Tensor();
  r.work = replicate_->all_reduce(r.grad_shard, ReduceOp::Avg);
  r.replicating = true;
}

void GradientReducer::finish(int f) {
  Flat& flat = flats_[f];
  InFlight& r = in_flight_[f];
  if (awaits_replication(f)) replicate(f);
  wait(f);
  // From launch to collected; under HYBRID_SHARD that spans both collectives.
  if (Trace::on()) Trace::span("reduce_scatter " + units_[flat.unit].label(), false, r.start_us, Trace::now());
  const Tensor grad = r.grad_shard.to(DType::f32);
  if (flat.shard.grad().defined()) {
    kernels::add_(flat.shard.grad(), grad);
  } else {
    flat.shard.set_grad(grad.clone());
  }
  if (r.grad_full.defined()) bytes_.add(-static_cast<int64_t>(r.grad_full.nbytes()));
  r.grad_full = Tensor();
  r.grad_shard = Tensor();
}

// Under HYBRID_SHARD each rank issues collectives on two groups, and the points where it issues the
// replicas' all-reduces must not depend on timing: a rank whose reduce-scatter of flat 1 finished
// early would issue all-reduce 1 before reduce-scatter 2, a slower one after, and two communicators
// whose collectives ranks order differently may wait on each other (NCCL kernels spin until their
// peers arrive). So flat b's all-reduce is issued when flat b + limit is launched (or at the end of
// the pass), a point every rank reaches in the same order; by then its reduce-scatter has had
// `limit` launches' time to finish, so the wait for it is short.
void GradientReducer::collect() {
  int in_flight = 0;
  for (int b = 0; b < order_.launched(); ++b) {
    const int f = reduce_order_[b];
    if (!in_flight_[f].work) continue;
    if (awaits_replication(f)) {
      if (b + limit_ >= order_.launched()) {
        ++in_flight;
        continue;
      }
      replicate(f);
    }
    if (in_flight_[f].work->is_completed()) {
      finish(f);
    } else {
      ++in_flight;
    }
  }
  // The oldest collectives while more than `limit` are in flight; never one still awaiting its
  // replicas' all-reduce, whose issue point is fixed above (at most `limit` of those are waiting).
  for (int b = 0; b < order_.launched() && in_flight > limit_; ++b) {
    const int f = reduce_order_[b];
    if (in_flight_[f].work && !awaits_replication(f)) finish(f), --in_flight;
  }
}

void GradientReducer::finish_pass() {
  if (!order_.pass_active()) return;
  order_.finish_pass([](int, int) {});  // a missing gradient stays zero in the full gradient
  launch_ready();
  for (int f : reduce_order_) {
    if (in_flight_[f].work) finish(f);
  }
  order_.end_pass();
}

}  // namespace octet::distributed::fsdp
