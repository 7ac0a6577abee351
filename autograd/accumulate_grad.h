#pragma once
// The node at the end of every path to a leaf: adds the incoming gradient into leaf.grad, then
// runs the leaf's post-accumulate hooks (where DDP starts a bucket's all-reduce).
#include <memory>

#include "autograd/node.h"

namespace octet::autograd {

class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(Tensor leaf);
  // The leaf's accumulator; one per leaf while any graph holds it, so all uses of a parameter in
  // one graph meet in one node and its hooks fire once with the full gradient.
  static std::shared_ptr<Node> for_leaf(const Tensor& leaf);

  std::vector<Tensor> apply(std::vector<Tensor> grad_outputs) override;

 private:
  Tensor leaf_;
};

}  // namespace octet::autograd
