// The FP8 side of an FSDP flat parameter (distributed/fsdp_fp8.h).
#include "distributed/fsdp_fp8.h"

#include <algorithm>
#include <utility>

#include "core/grad_mode.h"
#include "kernels/fp8.h"
#include "kernels/shape_ops.h"

namespace octet::distributed {

Fp8Flat::Fp8Flat(std::vector<Weight> weights, int64_t numel, int64_t padded, Device device)
    : weights_(std::move(weights)) {
  gathered_ = empty({padded}, DType::e4m3, device);
  transposed_ = empty({numel}, DType::e4m3, device);
  for (const Weight& w : weights_) {
    const Tensor& weight = w.linear->weight;
    const Shape& shape = weight.shape();
    data_.push_back(gathered_.narrow(w.offset, weight.numel()).reshape(shape));
    data_t_.push_back(transposed_.narrow(w.offset, weight.numel()).reshape({shape[1], shape[0]}));
  }
  gathered_.storage()->release();
  transposed_.storage()->release();
}

void Fp8Flat::prepare_states(const nn::Fp8Recipe& recipe, std::vector<const nn::Fp8LinearState*>& out) {
  for (const Weight& w : weights_) {
    nn::Fp8LinearState::prepare(w.linear->fp8_state, gathered_.device(), recipe);
    out.push_back(w.linear->fp8_state.get());
  }
}

Fp8Flat::Piece Fp8Flat::piece(size_t i, int64_t first, int64_t count) const {
  const int64_t lo = std::max(weights_[i].offset, first);
  const int64_t hi = std::min(weights_[i].offset + weights_[i].linear->weight.numel(), first + count);
  return hi > lo ? Piece{lo - first, hi - lo} : Piece{};
}

void Fp8Flat::piece_amaxes(const Tensor& rounded, int64_t first, const Tensor& amax) const {
  for (size_t i = 0; i < weights_.size(); ++i) {
    const Piece p = piece(i, first, rounded.numel());
    if (p.length > 0) kernels::fp8_amax_(rounded.narrow(p.begin, p.length), amax.narrow(static_cast<int64_t>(i), 1));
  }
}

void Fp8Flat::cast_shard(const Tensor& rounded, int64_t first, const Tensor& amax, const nn::Fp8Recipe& recipe) {
  NoGradGuard no_grad;
  shard_ = zeros({rounded.numel()}, DType::e4m3, rounded.device());  // the padding stays +0
  scale_inv_.assign(weights_.size(), Tensor());
  for (size_t i = 0; i < weights_.size(); ++i) {
    nn::Fp8LinearState& state = *weights_[i].linear->fp8_state;
    const nn::Fp8LinearState::Entry w = nn::record_weight_amax(state, amax.narrow(static_cast<int64_t>(i), 1), recipe);
    scale_inv_[i] = w.scale_inv.clone();  // the slot's changes with the next scale update; the cast's must not
    const Piece p = piece(i, first, rounded.numel());
    if (p.length == 0) continue;
    const kernels::Fp8Cast cast = kernels::fp8_cast(rounded.narrow(p.begin, p.length), w.scale, Tensor(),
                                                    state.forward.fp8_dtype, /*rowwise=*/true, /*transposed=*/false);
    shard_.narrow(p.begin, p.length).copy_(cast.data);
  }
}

void Fp8Flat::make_transposes() {
  for (size_t i = 0; i < weights_.size(); ++i) data_t_[i].copy_(kernels::transpose_last2(data_[i]));
}

void Fp8Flat::hand_over(const Tensor& source, bool with_transposes) {
  for (size_t i = 0; i < weights_.size(); ++i) {
    const kernels::Fp8Cast cast{data_[i], with_transposes ? data_t_[i] : Tensor(), scale_inv_[i]};
    weights_[i].linear->fp8_state->weight_cache.supply(cast, source);
  }
}

void Fp8Flat::take_back() {
  for (const Weight& w : weights_) {
    nn::Fp8LinearState* state = w.linear->fp8_state.get();
    if (state != nullptr && state->weight_cache.supplied()) state->weight_cache.clear();
  }
}

void Fp8AllGather::add(std::shared_ptr<Fp8Flat> flat, Tensor master, int64_t first) {
  entries_.push_back({std::move(flat), std::move(master), first});
}

void Fp8AllGather::begin_pass(const nn::Fp8Recipe* recipe, bool with_transposes, DType compute_dtype,
                              ProcessGroup* group) {
  if (recipe != nullptr) cast_shards(*recipe, compute_dtype, group);
  for (const Entry& e : entries_) {
    if (recipe != nullptr) {
      e.flat->hand_over(e.master, with_transposes);
    } else {
      e.flat->take_back();
    }
  }
}

void Fp8AllGather::cast_shards(const nn::Fp8Recipe& recipe, DType compute_dtype, ProcessGroup* group) {
  std::vector<const nn::Fp8LinearState*> states;
  for (const Entry& e : entries_) e.flat->prepare_states(recipe, states);
  std::vector<uint64_t> versions;
  for (const Entry& e : entries_) versions.push_back(e.master.version());
  if (versions == versions_ && states == states_) return;
  versions_ = versions;
  states_ = states;
  if (states.empty()) return;

  NoGradGuard no_grad;
  const Tensor amax = zeros({static_cast<int64_t>(states.size())}, DType::f32, entries_.front().master.device());
  std::vector<Tensor> rounded;  // the shards as the gathered weights would hold them
  int64_t j = 0;
  for (const Entry& e : entries_) {
    rounded.push_back(e.master.detach().to(compute_dtype));
    const auto n = static_cast<int64_t>(e.flat->size());
    e.flat->piece_amaxes(rounded.back(), e.first, amax.narrow(j, n));
    j += n;
  }
  if (group != nullptr) group->all_reduce(amax, ReduceOp::Max)->wait();
  j = 0;
  for (size_t k = 0; k < entries_.size(); ++k) {
    const auto n = static_cast<int64_t>(entries_[k].flat->size());
    entries_[k].flat->cast_shard(rounded[k], entries_[k].first, amax.narrow(j, n), recipe);
    j += n;
  }
}

}  // namespace octet::distributed
