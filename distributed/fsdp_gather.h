#pragma once
// FSDP's gathering (internal to distributed/fsdp*.cpp): all-gathers a unit's shards into its
// gathered buffers, which the module's parameters view, frees them again, and prefetches the next
// unit within the limit on units gathered at once. A gather is issued (start) and waited for
// (ensure) separately, so that a prefetch travels while the current unit computes.
#include <vector>

#include "distributed/fsdp_units.h"
#include "distributed/process_group.h"

namespace octet::distributed::fsdp {

class UnitGatherer {
 public:
  // `sharded` false (NO_SHARD): a gather is a copy of the whole shard. `limit`: non-root units
  // gathered at once, at most, counting prefetches.
  UnitGatherer(std::vector<Flat>& flats, std::vector<Unit>& units, ProcessGroup& group, bool sharded,
               DType compute_dtype, int limit, GatheredBytes& bytes);
  ~UnitGatherer();  // lets gathers in flight finish before their buffers go
  UnitGatherer(const UnitGatherer&) = delete;
  UnitGatherer& operator=(const UnitGatherer&) = delete;

  // How the gathers from now on move the FP8 flats: as E4M3 bytes (`fp8`), making the transposes a
  // backward needs (`transposes`); or in the compute dtype like the rest.
  void set_fp8(bool fp8, bool transposes);

  void start(int u);   // issues unit u's gathers, unless it is gathered or on its way
  void ensure(int u);  // unit u is gathered when this returns
  void release(int u);  // frees unit u's buffers (waiting for a prefetch nobody used)
  void release_all();
  // Starts the unit after `u` in `order`, if there is one and the limit allows.
  void prefetch_after(int u, const std::vector<int>& order);

  int gathered_now() const { return gathered_now_; }  // non-root units
  int gathered_max() const { return gathered_max_; }
  bool room_for_another() const { return gathered_now_ < limit_; }

 private:
  struct UnitState {
    bool gathered = false;
    bool fp8 = false, transposed = false;  // how it was last gathered
    WorkHandle work;                       // a gather in flight
    std::vector<Tensor> inputs;            // what it reads, kept alive until it is done
    int64_t start_us = 0;
  };
  // The shard's version at the last gather into a flat's buffer, and the buffer's version after it.
  struct Carried {
    uint64_t from = UINT64_MAX, version = 0;
  };
  void carry_version(int f);
  void allocate(const Tensor& buffer);
  void free(const Tensor& buffer);

  std::vector<Flat>& flats_;
  std::vector<Unit>& units_;
  ProcessGroup& group_;
  bool sharded_;
  DType compute_dtype_;
  int limit_;
  GatheredBytes& bytes_;
  std::vector<UnitState> state_;
  std::vector<Carried> carried_;
  bool fp8_ = false, transposes_ = false;
  int gathered_now_ = 0, gathered_max_ = 0;
};

}  // namespace octet::distributed::fsdp
