#include "distributed/process_group.h"

#include <fmt/format.h>

#include <exception>
#include <string>

#include "core/error.h"
#include "core/log.h"
#include "distributed/launch.h"

namespace octet::distributed {

void synchronize_in_destructor(Work& work, const char* owner) noexcept {
  std::string failure;
  try {
    work.synchronize();
    return;
  } catch (const std::exception& e) {
    try {
      failure = fmt::format("{}: a collective in flight at its destruction failed: {}", owner, e.what());
    } catch (...) {  // no memory for the message
    }
  }
  if (std::uncaught_exceptions() == 0) abort_job(failure);
  try {
    logging::warn("{}", failure);
  } catch (...) {  // logging failed too: nothing more to do in a destructor
  }
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
  }
  return "?";
}

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::AllReduce: return "all_reduce";
    case Collective::ReduceScatter: return "reduce_scatter";
    case Collective::AllGather: return "all_gather";
    case Collective::Broadcast: return "broadcast";
    case Collective::Barrier: return "barrier";
  }
  return "?";
}

double CommCounters::bus_bytes(Collective c) const {
  const double n = world_size, payload = static_cast<double>(payload_of(c));
  switch (c) {
    case Collective::AllReduce: return payload * 2.0 * (n - 1.0) / n;
    case Collective::ReduceScatter:
    case Collective::AllGather: return payload * (n - 1.0) / n;
    case Collective::Broadcast: return payload;
    case Collective::Barrier: return 0.0;
  }
  return 0.0;
}

std::string format_bytes(double bytes) {
  if (bytes >= 1e9) return fmt::format("{:.2f} GB", bytes / 1e9);
  if (bytes >= 1e6) return fmt::format("{:.2f} MB", bytes / 1e6);
  if (bytes >= 1e3) return fmt::format("{:.2f} kB", bytes / 1e3);
  return fmt::format("{} B", static_cast<int64_t>(bytes));
}

ProcessGroup::ProcessGroup(int rank, int size, ProcessGroupOptions options)
    : rank_(rank), size_(size), options_(options) {
  OCTET_CHECK(size_ >= 1 && rank_ >= 0 && rank_ < size_, "ProcessGroup: rank ", rank_, " of world size ", size_,
              " is invalid");
  counters_.world_size = size_;
}

void ProcessGroup::reset_counters() {
  counters_ = CommCounters{};
  counters_.world_size = size_;
}

void ProcessGroup::count(Collective c, int64_t payload_bytes) {
  counters_.calls[static_cast<size_t>(c)] += 1;
  counters_.payload_bytes[static_cast<size_t>(c)] += payload_bytes;
}

// The checks run on every rank before anything is sent, so a wrong call fails on every rank that
// makes it instead of leaving the others waiting for a message that never comes.
void ProcessGroup::check_tensor(const char* op, const Tensor& t) const {
  OCTET_CHECK(t.defined(), op, ": the tensor is undefined; pass an allocated tensor");
  const Device d = device();
  OCTET_CHECK(t.device().type == d.type && (d.is_cpu() || t.device().index == d.index), op, ": ", t.describe(),
              " is on ", t.device().str(), " but this ", backend(), " group works on ", d.str(),
              "; move the tensor with .to(", d.str(), ") or make the group for its device");
}

namespace {

void check_reducible(const char* op, const Tensor& t) {
  const DType d = t.dtype();
  OCTET_CHECK(d == DType::f32 || d == DType::f64 || d == DType::bf16 || d == DType::f16 || d == DType::i64, op,
              ": cannot reduce ", t.describe(), "; reductions take f32, f64, bf16, f16 or i64 (gather FP8 bytes, "
              "reduce in a wider dtype)");
}

// An integer average would truncate, differently on each backend.
void check_average(const char* op, const Tensor& t, ReduceOp reduce) {
  OCTET_CHECK(reduce != ReduceOp::Avg || t.dtype() != DType::i64, op, ": cannot average the integers of ",
              t.describe(), "; reduce with Sum and divide, or average a floating copy");
}

void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  OCTET_CHECK(a.dtype() == b.dtype(), op, ": ", a.describe(), " and ", b.describe(),
              " differ in dtype; give both the same dtype");
}

// all_gather into a list: one flat all_gather into a scratch buffer, copied out to the list when
// waited on (the list's tensors need not be adjacent in memory).
class ListGatherWork : public Work {
 public:
  ListGatherWork(WorkHandle flat, Tensor buffer, std::vector<Tensor> outputs)
      : flat_(std::move(flat)), buffer_(std::move(buffer)), outputs_(std::move(outputs)) {}
  void wait() override {
    flat_->wait();
    copy_out();
  }
  void synchronize() override {
    flat_->synchronize();
    copy_out();
  }
  bool is_completed() override {
    if (!flat_->is_completed()) return false;
    copy_out();  // finished means the list holds the result
    return true;
  }
  std::string describe() const override { return flat_->describe() + " (into a list)"; }

 private:
  void copy_out() {
    if (copied_) return;
    const int64_t n = outputs_.front().numel();
    for (size_t r = 0; r < outputs_.size(); ++r) {
      outputs_[r].copy_(buffer_.narrow(static_cast<int64_t>(r) * n, n).reshape(outputs_[r].shape()));
    }
    copied_ = true;
  }
  WorkHandle flat_;
  Tensor buffer_;
  std::vector<Tensor> outputs_;
  bool copied_ = false;
};

}  // namespace

WorkHandle ProcessGroup::all_reduce(const Tensor& tensor, ReduceOp op) {
  check_tensor("all_reduce", tensor);
  check_reducible("all_reduce", tensor);
  check_average("all_reduce", tensor, op);
  count(Collective::AllReduce, static_cast<int64_t>(tensor.nbytes()));
  tensor.bump_version();
  return do_all_reduce(tensor, op);
}

WorkHandle ProcessGroup::reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) {
  check_tensor("reduce_scatter", output);
  check_tensor("reduce_scatter", input);
  check_reducible("reduce_scatter", input);
  check_average("reduce_scatter", input, op);
  check_same_dtype("reduce_scatter", output, input);
  OCTET_CHECK(input.numel() == output.numel() * size_, "reduce_scatter: the input ", input.describe(), " must hold ",
              size_, " chunks of the output ", output.describe(), " (", output.numel() * size_,
              " elements); size the input world_size × output");
  count(Collective::ReduceScatter, static_cast<int64_t>(input.nbytes()));
  output.bump_version();
  return do_reduce_scatter(output, input, op);
}

WorkHandle ProcessGroup::all_gather(const Tensor& output, const Tensor& input) {
  check_tensor("all_gather", output);
  check_tensor("all_gather", input);
  check_same_dtype("all_gather", output, input);
  OCTET_CHECK(output.numel() == input.numel() * size_, "all_gather: the output ", output.describe(), " must hold ",
              size_, " × the input ", input.describe(), " (", input.numel() * size_,
              " elements); size the output world_size × input");
  count(Collective::AllGather, static_cast<int64_t>(output.nbytes()));
  output.bump_version();
  return do_all_gather(output, input);
}

WorkHandle ProcessGroup::all_gather(const std::vector<Tensor>& outputs, const Tensor& input) {
  check_tensor("all_gather", input);
  OCTET_CHECK(static_cast<int>(outputs.size()) == size_, "all_gather: got a list of ", outputs.size(),
              " outputs for a world of ", size_, "; pass one tensor per rank");
  for (const Tensor& out : outputs) {
    check_tensor("all_gather", out);
    check_same_dtype("all_gather", out, input);
    OCTET_CHECK(out.shape() == input.shape(), "all_gather: output ", out.describe(), " does not match the input ",
                input.describe(), "; every output must have the input's shape");
  }
  const Tensor buffer = empty({input.numel() * size_}, input.dtype(), input.device());
  return std::make_shared<ListGatherWork>(all_gather(buffer, input), buffer, outputs);
}

WorkHandle ProcessGroup::broadcast(const Tensor& tensor, int root) {
  check_tensor("broadcast", tensor);
  OCTET_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " is not a rank of this world of ", size_,
              "; pass 0 <= root < ", size_);
  count(Collective::Broadcast, static_cast<int64_t>(tensor.nbytes()));
  tensor.bump_version();
  return do_broadcast(tensor, root);
}

WorkHandle ProcessGroup::barrier() {
  count(Collective::Barrier, 0);
  return do_barrier();
}

// The color differs from rank to rank, so a bad one fails on its rank alone: the others wait in the
// split until the group's timeout ends the job, as for a collective a rank never joined.
std::shared_ptr<ProcessGroup> ProcessGroup::split(int color, int key) {
  OCTET_CHECK(color >= 0 || color == kNoColor, "split: color ", color, " on rank ", rank_, " of ", size_,
              " is negative; pass a color >= 0, or ProcessGroup::kNoColor for a rank that joins no group");
  std::shared_ptr<ProcessGroup> group = do_split(color, key);
  if (group != nullptr) register_group(group);
  return group;
}

// ---- LocalProcessGroup ---------------------------------------------------------------------------

LocalProcessGroup::LocalProcessGroup(Device device, ProcessGroupOptions options)
    : ProcessGroup(0, 1, options), device_(device) {}

WorkHandle LocalProcessGroup::do_all_reduce(const Tensor& tensor, ReduceOp op) {
  return std::make_shared<CompletedWork>(fmt::format("all_reduce({}) of {}", reduce_op_name(op),
                                                     format_bytes(static_cast<double>(tensor.nbytes()))));
}

WorkHandle LocalProcessGroup::do_reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) {
  output.copy_(input.reshape(output.shape()));
  return std::make_shared<CompletedWork>(fmt::format("reduce_scatter({}) of {}", reduce_op_name(op),
                                                     format_bytes(static_cast<double>(input.nbytes()))));
}

WorkHandle LocalProcessGroup::do_all_gather(const Tensor& output, const Tensor& input) {
  output.copy_(input.reshape(output.shape()));
  return std::make_shared<CompletedWork>(
      fmt::format("all_gather of {}", format_bytes(static_cast<double>(output.nbytes()))));
}

WorkHandle LocalProcessGroup::do_broadcast(const Tensor& tensor, int root) {
  return std::make_shared<CompletedWork>(
      fmt::format("broadcast from {} of {}", root, format_bytes(static_cast<double>(tensor.nbytes()))));
}

WorkHandle LocalProcessGroup::do_barrier() { return std::make_shared<CompletedWork>("barrier"); }

std::shared_ptr<ProcessGroup> LocalProcessGroup::do_split(int color, int) {
  if (color == kNoColor) return nullptr;
  return std::make_shared<LocalProcessGroup>(device_, options());
}

}  // namespace octet::distributed
