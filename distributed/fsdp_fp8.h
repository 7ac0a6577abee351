#pragma once
// FSDP's FP8 all-gather (FsdpOptions::fp8_all_gather; distributed/fsdp.h, "FP8 all-gather", has the
// design). Internal to distributed/fsdp.cpp: an Fp8Flat per flat parameter whose parameters are all
// weights of FP8 Linears, and Fp8AllGather over all of them, which makes the E4M3 shards once per
// change of the master weights (an optimizer step, a load: their Storage::version).
//
// It holds the flat's E4M3 buffers: the gathered bytes [padded] and the weights' transposes [numel],
// both released while the unit is not gathered in FP8, and each weight's views of them, which it hands
// to the weight's Linear as that Linear's weight cast. And this rank's E4M3 shard, cast once per change
// of the weights from the shard rounded to the compute dtype, piece by piece with each weight's scale.
#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "distributed/process_group.h"
#include "nn/fp8.h"
#include "nn/layers.h"

namespace octet::distributed {

class Fp8Flat {
 public:
  struct Weight {
    std::shared_ptr<nn::Linear> linear;
    int64_t offset = 0;  // its first element in the flat
  };
  // A flat of `numel` elements padded to `padded`, on `device`. The buffers start released.
  Fp8Flat(std::vector<Weight> weights, int64_t numel, int64_t padded, Device device);

  size_t size() const { return weights_.size(); }
  const Tensor& gathered() const { return gathered_; }
  const Tensor& transposed() const { return transposed_; }
  const Tensor& shard() const { return shard_; }  // undefined before the first cast_shard

  // Makes each weight's FP8 state fit `recipe` (nn::Fp8LinearState::prepare) and appends it to `out`.
  void prepare_states(const nn::Fp8Recipe& recipe, std::vector<const nn::Fp8LinearState*>& out);

  // `rounded` holds flat elements [first, first + rounded.numel()): this rank's shard in the compute
  // dtype. Entry i of `amax` ← max(entry i, amax of weight i's elements in it).
  void piece_amaxes(const Tensor& rounded, int64_t first, const Tensor& amax) const;

  // Given every weight's amax over all ranks (entry i of `amax`), sets each weight's scale with
  // nn::record_weight_amax, as the Linear's own cast of the whole weight does. Then casts `rounded`
  // (as above) into shard(), each weight's piece with its scale; padding is +0.
  void cast_shard(const Tensor& rounded, int64_t first, const Tensor& amax, const nn::Fp8Recipe& recipe);

  // After a gather into gathered(): each weight's transpose, the operand of the backward GEMM.
  void make_transposes();

  // Supplies each Linear's weight cache with its cast: the views, with the transpose when
  // `with_transposes`, and the scale_inv of cast_shard; good while `source` (the master shard the
  // casts were made from) is unchanged. take_back undoes it, so that a Linear casts its own
  // (bf16-gathered) weight again.
  void hand_over(const Tensor& source, bool with_transposes);
  void take_back();

 private:
  // Elements [begin, begin + length) of `rounded` belong to weight i (length 0: none).
  struct Piece {
    int64_t begin = 0, length = 0;
  };
  Piece piece(size_t i, int64_t first, int64_t count) const;

  std::vector<Weight> weights_;
  Tensor gathered_, transposed_, shard_;
  std::vector<Tensor> data_, data_t_;  // per weight: [out, in] and [in, out] views of gathered_, transposed_
  std::vector<Tensor> scale_inv_;      // per weight, [1] f32: 1/scale of its cast in shard_
};

// Every FP8 flat of one FSDP model.
class Fp8AllGather {
 public:
  // `master` is this rank's f32 shard of the flat (updated in place by the optimizer), holding flat
  // elements [first, first + master.numel()).
  void add(std::shared_ptr<Fp8Flat> flat, Tensor master, int64_t first);

  // At the start of a forward. With a recipe (the forward runs in FP8): makes every flat's E4M3
  // shard when the weights changed since the last time (a master shard's Storage::version moved, or
  // FP8 states were replaced), then hands the Linears their casts (with transposes when
  // `with_transposes`).
  // Each weight's amax is max-reduced over `group` (null: one rank holds everything) from the
  // pieces, rounded to `compute_dtype` as the gathered weight would be, in one all_reduce. Without a
  // recipe: takes the casts back.
  void begin_pass(const nn::Fp8Recipe* recipe, bool with_transposes, DType compute_dtype, ProcessGroup* group);

 private:
  void cast_shards(const nn::Fp8Recipe& recipe, DType compute_dtype, ProcessGroup* group);

  struct Entry {
    std::shared_ptr<Fp8Flat> flat;
    Tensor master;
    int64_t first = 0;
  };
  std::vector<Entry> entries_;
  std::vector<uint64_t> versions_;  // the master shards' versions the E4M3 shards were made at
  std::vector<const nn::Fp8LinearState*> states_;  // ... and the states whose scales they used
};

}  // namespace octet::distributed
