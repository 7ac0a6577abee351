// FSDP's gathering and prefetch (distributed/fsdp_gather.h).
#include "distributed/fsdp_gather.h"

#include <algorithm>

namespace octet::distributed::fsdp {

UnitGatherer::UnitGatherer(std::vector<Flat>& flats, std::vector<Unit>& units, ProcessGroup& group, bool sharded,
                           DType compute_dtype, int limit, GatheredBytes& bytes)
    : flats_(flats), units_(units), group_(group), sharded_(sharded), compute_dtype_(compute_dtype), limit_(limit),
      bytes_(bytes), state_(units.size()), carried_(flats.size()) {}

UnitGatherer::~UnitGatherer() {
  for (UnitState& s : state_) {
    if (s.work) synchronize_in_destructor(*s.work, "FullyShardedDataParallel (a parameter all-gather)");
  }
}

void UnitGatherer::set_fp8(bool fp8, bool transposes) {
  fp8_ = fp8;
  transposes_ = fp8 && transposes;
}

void UnitGatherer::start(int u) {
  UnitState& s = state_[u];
  if (s.gathered || s.work) return;
  s.start_us = Trace::now();
  s.inputs.clear();
  s.fp8 = fp8_;
  s.transposed = transposes_;
  for (int f : units_[u].flats) {
    const Flat& flat = flats_[f];
    const bool fp8 = s.fp8 && flat.fp8;
    const Tensor& buffer = fp8 ? flat.fp8->gathered() : flat.gathered;
    allocate(buffer);
    if (fp8 && s.transposed) allocate(flat.fp8->transposed());
    const Tensor input = fp8 ? flat.fp8->shard() : flat.shard.detach().to(compute_dtype_).clone();
    s.inputs.push_back(input);
    if (sharded_) {
      s.work = group_.all_gather(buffer, input);
    } else {
      buffer.copy_(input);
    }
    if (!fp8) carry_version(f);
  }
  if (!s.work) s.work = std::make_shared<CompletedWork>("no_shard copy");
  if (u != 0) gathered_max_ = std::max(gathered_max_, ++gathered_now_);
}

// A gather from shards unchanged since the last one writes the bytes the buffer held after it: the
// buffer gets that gather's version back, so what was cached from those bytes (the FP8 Linears'
// weight casts, nn::Fp8WeightCache) stays good, as in an unsharded model between optimizer steps.
// Every rank's shard changes together (an optimizer step, a load), so this rank's shard version
// stands for all of them.
void UnitGatherer::carry_version(int f) {
  const Flat& flat = flats_[f];
  Carried& c = carried_[f];
  if (flat.shard.version() == c.from) {
    flat.gathered.storage()->restore_version(c.version);
  } else {
    c.from = flat.shard.version();
    c.version = flat.gathered.version();
  }
}

void UnitGatherer::allocate(const Tensor& buffer) {
  buffer.storage()->reallocate();
  bytes_.add(static_cast<int64_t>(buffer.nbytes()));
}

void UnitGatherer::free(const Tensor& buffer) {
  buffer.storage()->release();
  bytes_.add(-static_cast<int64_t>(buffer.nbytes()));
}

void UnitGatherer::ensure(int u) {
  UnitState& s = state_[u];
  if (s.gathered) return;
  start(u);
  const int64_t wait_start = Trace::now();
  s.work->wait();  // the group runs collectives in order: every flat's gather is done
  s.work.reset();
  s.inputs.clear();
  s.gathered = true;
  if (s.transposed) {  // the backward GEMM's operand, from the gathered bytes (after the wait)
    for (int f : units_[u].flats) {
      if (flats_[f].fp8) flats_[f].fp8->make_transposes();
    }
  }
  if (Trace::on()) {
    const int64_t now = Trace::now();
    // From issue (a prefetch: earlier) to ready, and the part of it compute waited for.
    Trace::span("gather " + units_[u].label(), false, s.start_us, now);
    Trace::span("wait " + units_[u].label(), true, wait_start, now);
  }
}

void UnitGatherer::release(int u) {
  UnitState& s = state_[u];
  if (s.work) {  // a prefetch nobody used: finish it before freeing its buffer
    s.work->wait();
    s.work.reset();
    s.gathered = true;
  }
  if (!s.gathered) return;
  if (Trace::on()) {
    const int64_t now = Trace::now();
    Trace::span("free " + units_[u].label(), false, now, now + 1);
  }
  for (int f : units_[u].flats) {
    const Flat& flat = flats_[f];
    const bool fp8 = s.fp8 && flat.fp8;
    free(fp8 ? flat.fp8->gathered() : flat.gathered);
    if (fp8 && s.transposed) free(flat.fp8->transposed());
  }
  s.gathered = false;
  if (u != 0) --gathered_now_;
}

void UnitGatherer::release_all() {
  for (size_t u = 0; u < units_.size(); ++u) release(static_cast<int>(u));
}

void UnitGatherer::prefetch_after(int u, const std::vector<int>& order) {
  const auto it = std::find(order.begin(), order.end(), u);
  if (it == order.end() || it + 1 == order.end()) return;
  const int next = *(it + 1);
  if (next != 0 && !room_for_another()) return;
  start(next);
}

}  // namespace octet::distributed::fsdp
