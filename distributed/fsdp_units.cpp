// FSDP's flat parameters made from a module's parameters (distributed/fsdp_units.h).
#include "distributed/fsdp_units.h"

#include <utility>

#include "core/grad_mode.h"
#include "nn/fp8_linear.h"

namespace octet::distributed::fsdp {

std::map<std::string, std::shared_ptr<nn::Linear>> fp8_linears(nn::Module& module, DType compute_dtype) {
  std::map<std::string, std::shared_ptr<nn::Linear>> out;
  for (const auto& [name, m] : module.named_modules()) {
    auto linear = std::dynamic_pointer_cast<nn::Linear>(m);
    if (linear != nullptr && linear->fp8_allowed &&
        nn::fp8_linear_unsupported_reason(linear->in_features, linear->out_features, compute_dtype, compute_dtype)
            .empty()) {
      out[name.empty() ? "weight" : name + ".weight"] = linear;
    }
  }
  return out;
}

Flat make_flat(const FlatLayout& layout, const std::vector<nn::NamedTensor>& parameters,
               const std::map<std::string, std::shared_ptr<nn::Linear>>& fp8_weights, ProcessGroup& group, int rank,
               DType compute_dtype) {
  NoGradGuard no_grad;
  const Device device = parameters.at(layout.parameters.at(0)).second.device();
  // The shard, gathered and fp8 are set below.
  Flat flat{layout.unit, layout.key, layout.trainable, {}, layout.numel, layout.padded, layout.shard_numel,
            Tensor(),    Tensor(),   nullptr};
  const Tensor full = zeros({flat.padded}, DType::f32, device);
  std::vector<Fp8Flat::Weight> fp8;
  for (size_t i = 0; i < layout.parameters.size(); ++i) {
    const auto& [name, p] = parameters[layout.parameters[i]];
    flat.slots.push_back({name, p, layout.offsets[i]});
    full.narrow(layout.offsets[i], p.numel()).copy_(p.detach().flatten());
    if (layout.fp8) fp8.push_back({fp8_weights.at(name), layout.offsets[i]});
  }
  group.broadcast(full, 0)->wait();
  flat.shard = full.narrow(rank * flat.shard_numel, flat.shard_numel).clone();
  flat.shard.requires_grad_(flat.trainable);
  if (layout.fp8) flat.fp8 = std::make_shared<Fp8Flat>(std::move(fp8), flat.numel, flat.padded, device);
  flat.gathered = empty({flat.padded}, compute_dtype, device);
  for (Slot& slot : flat.slots) {
    slot.parameter.set_data(flat.gathered.narrow(slot.offset, slot.parameter.numel()).reshape(slot.parameter.shape()));
    slot.parameter.set_grad(Tensor());
  }
  flat.gathered.storage()->release();
  return flat;
}

}  // namespace octet::distributed::fsdp
