#include "distributed/ddp.h"

#include <fmt/format.h>

#include "autograd/engine.h"
#include "core/error.h"
#include "core/grad_mode.h"
#include "core/log.h"
#include "distributed/ordered_reducer.h"

namespace octet::distributed {

struct DistributedDataParallel::State {
  struct Slot {
    Tensor parameter;
    int bucket = 0, member = 0;  // its place in the bucket's slot list
    int64_t offset = 0;          // in the bucket's flat buffer, in elements
  };
  struct Bucket {
    Tensor flat;             // [numel] in reduce_dtype
    std::vector<int> slots;  // indices into `slots`, in buffer order
    WorkHandle work;         // the all-reduce in flight, once launched
  };

  std::shared_ptr<ProcessGroup> group;
  std::vector<Slot> slots;
  std::vector<Bucket> buckets;
  std::unique_ptr<OrderedReducer> order;  // which buckets are full, released in bucket order
  bool sync = true;                       // false inside no_sync()
  bool overlap = true;                    // launch buckets during backward (DdpOptions::overlap)

  void launch_ready() {
    for (int b : order->take_ready()) buckets[b].work = group->all_reduce(buckets[b].flat, ReduceOp::Avg);
  }

  void on_gradient(int index) {
    const Slot& s = slots[index];
    order->arrive(s.bucket, s.member);
    buckets[s.bucket].flat.narrow(s.offset, s.parameter.numel()).copy_(s.parameter.grad().flatten());
    if (overlap) launch_ready();
  }

  void finalize() {
    if (!order->pass_active()) return;
    order->finish_pass([&](int b, int m) {
      const Slot& s = slots[buckets[b].slots[m]];
      buckets[b].flat.narrow(s.offset, s.parameter.numel()).zero_();
    });
    launch_ready();
    for (Bucket& b : buckets) {
      b.work->wait();
      b.work.reset();
      for (int index : b.slots) {
        Slot& s = slots[index];
        const Tensor averaged = b.flat.narrow(s.offset, s.parameter.numel()).reshape(s.parameter.shape());
        if (s.parameter.grad().defined()) {
          s.parameter.grad().copy_(averaged);
        } else {
          s.parameter.set_grad(averaged.to(s.parameter.dtype()).clone());
        }
      }
    }
    order->end_pass();
  }
};

namespace {

// Every rank must wrap the same model: compare the parameter count and total size across ranks
// before any bucket exists, so a mismatch is an error on every rank instead of a hang.
void check_same_model(ProcessGroup& group, const std::vector<nn::NamedTensor>& params) {
  int64_t numel = 0;
  for (const auto& p : params) numel += p.second.numel();
  const Tensor mine = from_vector<int64_t>({static_cast<int64_t>(params.size()), numel}, {2});
  const Tensor all = empty({2 * group.size()}, DType::i64, group.device());
  group.all_gather(all, mine.to(group.device()))->wait();
  const std::vector<int64_t> v = all.to_vector<int64_t>();
  for (int r = 0; r < group.size(); ++r) {
    OCTET_CHECK(v[2 * r] == static_cast<int64_t>(params.size()) && v[2 * r + 1] == numel,
                "DistributedDataParallel: rank ", r, " wraps a model with ", v[2 * r], " parameters (", v[2 * r + 1],
                " elements) but rank ", group.rank(), "'s has ", params.size(), " (", numel,
                " elements); every rank must build the same model");
  }
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module,
                                                 std::shared_ptr<ProcessGroup> group, DdpOptions options)
    : module_(std::move(module)), group_(std::move(group)), state_(std::make_shared<State>()) {
  OCTET_CHECK(module_ != nullptr && group_ != nullptr, "DistributedDataParallel: the module or the process group is "
              "null; pass both");
  OCTET_CHECK(options.reduce_dtype == DType::f32 || options.reduce_dtype == DType::bf16,
              "DistributedDataParallel: reduce_dtype ", dtype_name(options.reduce_dtype),
              " is not supported; use f32 or bf16");
  OCTET_CHECK(options.bucket_cap_mb > 0 && options.first_bucket_cap_mb > 0,
              "DistributedDataParallel: bucket caps must be positive (got ", options.first_bucket_cap_mb, " and ",
              options.bucket_cap_mb, " MB)");
  std::vector<nn::NamedTensor> params;
  for (const auto& p : module_->named_parameters()) {
    if (p.second.requires_grad()) params.push_back(p);
  }
  OCTET_CHECK(!params.empty(), "DistributedDataParallel: the module has no parameters that require grad");
  const Device device = params.front().second.device();
  for (const auto& p : params) {
    OCTET_CHECK(p.second.device() == device, "DistributedDataParallel: ", p.first, " is on ", p.second.device().str(),
                " but ", params.front().first, " is on ", device.str(), "; move the whole module to one device");
  }
  check_same_model(*group_, params);

  if (options.broadcast_on_wrap) {
    NoGradGuard no_grad;
    for (const auto& p : params) group_->broadcast(p.second.detach(), 0)->wait();
    for (const auto& b : module_->named_buffers()) group_->broadcast(b.second, 0)->wait();
  }

  // Buckets in reverse registration order.
  State& s = *state_;
  s.group = group_;
  s.overlap = options.overlap;
  const size_t element = dtype_size(options.reduce_dtype);
  double cap = options.first_bucket_cap_mb * 1e6;
  std::vector<std::vector<int>> members(1);
  std::vector<std::vector<std::string>> names(1);
  int64_t bucket_numel = 0;
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    const int64_t n = it->second.numel();
    if (bucket_numel > 0 && static_cast<double>((bucket_numel + n) * element) > cap) {
      members.emplace_back();
      names.emplace_back();
      bucket_numel = 0;
      cap = options.bucket_cap_mb * 1e6;
    }
    const int index = static_cast<int>(s.slots.size());
    s.slots.push_back({it->second, static_cast<int>(members.size()) - 1, static_cast<int>(members.back().size()),
                       bucket_numel});
    members.back().push_back(index);
    names.back().push_back(it->first);
    bucket_numel += n;
  }
  for (auto& m : members) {
    State::Bucket b;
    int64_t numel = 0;
    for (int index : m) numel += s.slots[index].parameter.numel();
    b.flat = empty({numel}, options.reduce_dtype, device);
    b.slots = std::move(m);
    s.buckets.push_back(std::move(b));
  }
  s.order = std::make_unique<OrderedReducer>(std::move(names), "DistributedDataParallel");

  std::weak_ptr<State> weak = state_;
  for (size_t i = 0; i < s.slots.size(); ++i) {
    s.slots[i].parameter.register_post_accumulate_grad_hook([weak, index = static_cast<int>(i)](Tensor&) {
      const std::shared_ptr<State> state = weak.lock();
      if (state == nullptr || !state->sync) return;  // unwrapped, or inside no_sync()
      if (!state->order->pass_active()) {
        state->order->begin_pass();
        autograd::queue_callback([weak] {
          if (auto st = weak.lock()) st->finalize();
        });
      }
      state->on_gradient(index);
    });
  }
  logging::debug("DistributedDataParallel: {} parameters in {} buckets over {} ranks ({} backend)", s.slots.size(),
                 s.buckets.size(), group_->size(), group_->backend());
}

DistributedDataParallel::~DistributedDataParallel() {
  // A backward that threw may have left buckets in flight: let them finish before the buffers go.
  for (State::Bucket& b : state_->buckets) {
    if (b.work) synchronize_in_destructor(*b.work, "DistributedDataParallel");
  }
}

void DistributedDataParallel::finalize_backward() { state_->finalize(); }

std::vector<DistributedDataParallel::BucketInfo> DistributedDataParallel::buckets() const {
  std::vector<BucketInfo> out;
  for (const State::Bucket& b : state_->buckets) {
    BucketInfo info;
    info.parameters = state_->order->names(static_cast<int>(&b - state_->buckets.data()));
    info.numel = b.flat.numel();
    info.bytes = b.flat.nbytes();
    out.push_back(std::move(info));
  }
  return out;
}

DistributedDataParallel::NoSyncGuard::NoSyncGuard(DistributedDataParallel& ddp)
    : ddp_(ddp), previous_(ddp.state_->sync) {
  ddp_.state_->sync = false;
}

DistributedDataParallel::NoSyncGuard::~NoSyncGuard() { ddp_.state_->sync = previous_; }

nn::AmaxReducer fp8_amax_reducer(std::shared_ptr<ProcessGroup> group) {
  return [group = std::move(group)](const Tensor& amaxes) { group->all_reduce(amaxes, ReduceOp::Max)->wait(); };
}

}  // namespace octet::distributed
