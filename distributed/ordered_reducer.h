#pragma once
// The bookkeeping that DDP and FSDP share in backward: gradients arrive in whatever order autograd
// produces them, which may differ from rank to rank, but every rank must issue the same collectives
// in the same order or the job hangs. So the gradients are grouped in buckets (DDP's buckets, FSDP's
// flat parameters) with a fixed order, and a bucket is released for reduction only when it is full
// and every bucket before it has been released.
//
//   OrderedReducer reducer(names, "DistributedDataParallel");
//   reducer.begin_pass();                                  // at the first gradient of a backward
//   reducer.arrive(bucket, member);                        // a parameter's gradient is in
//   for (int b : reducer.take_ready()) launch(b);          // full buckets, in bucket order
//   ...
//   reducer.finish_pass([&](int b, int m) { fill(b, m); });  // end of backward: what never came
//   for (int b : reducer.take_ready()) launch(b);          // now every bucket
//
// At the end of backward a parameter this rank never reached (an unused branch) still has its place
// in its bucket: the caller fills it (zeros) so the bucket can be reduced, since another rank may
// have used it.
#include <functional>
#include <string>
#include <vector>

namespace octet::distributed {

class OrderedReducer {
 public:
  // names[b]: the parameters of bucket b, for error messages; `owner` names the wrapper in them.
  OrderedReducer(std::vector<std::vector<std::string>> names, std::string owner);

  int buckets() const { return static_cast<int>(names_.size()); }
  const std::vector<std::string>& names(int b) const { return names_[b]; }
  bool pass_active() const { return active_; }
  int launched() const { return launched_; }  // buckets [0, launched()) are released this pass

  // A backward pass begins: every bucket waits for all its members again.
  void begin_pass();
  // Member m of bucket b has its gradient. Twice in one pass is an error naming the parameter.
  void arrive(int b, int m);
  // The buckets that are full and next in order, marked released: launch them in this order.
  std::vector<int> take_ready();
  // Calls missing(b, m) for every member that has not arrived, and counts it as arrived; the pass
  // then ends once take_ready() has released every bucket.
  void finish_pass(const std::function<void(int b, int m)>& missing);
  void end_pass() { active_ = false; }

 private:
  std::vector<std::vector<std::string>> names_;
  std::string owner_;
  std::vector<std::vector<bool>> arrived_;
  std::vector<int> pending_;  // per bucket: members still to arrive
  int launched_ = 0;
  bool active_ = false;
};

}  // namespace octet::distributed
