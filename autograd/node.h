#pragma once
// The backward graph. Every differentiable op that sees an input requiring grad leaves a Node
// behind: it knows how to turn the gradients of its outputs into gradients of its inputs, and where
// each input's gradient goes next (an Edge). Leaves end in an AccumulateGrad node that adds into
// .grad and then runs the post-accumulate hooks DDP and FSDP hang their communication on.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace octet::autograd {

class Node;

// Where a gradient flows: input slot `input_nr` of `node`. A null node means "no gradient needed".
struct Edge {
  std::shared_ptr<Node> node;
  uint32_t input_nr = 0;
};

// What a gradient must look like: used to materialise zeros and to check what backward returns.
struct TensorMeta {
  Shape shape;
  DType dtype = DType::f32;
  Device device;
  static TensorMeta of(const Tensor& t) { return {t.shape(), t.dtype(), t.device()}; }
};

class Node {
 public:
  explicit Node(std::string name);
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  const std::string& name() const { return name_; }
  // Creation order. Among nodes that are ready, the engine runs the most recent first, so backward
  // visits layers in the reverse of forward order.
  uint64_t sequence_nr() const { return sequence_nr_; }

  // One gradient per output in, one per next edge out (undefined where none is needed).
  virtual std::vector<Tensor> apply(std::vector<Tensor> grad_outputs) = 0;
  // Frees what forward saved; called after apply unless the graph is retained.
  virtual void release_saved() {}

  std::vector<Edge> next_edges;                                      // one per input
  std::vector<TensorMeta> input_meta;                                // parallel to next_edges
  std::vector<TensorMeta> output_meta;                               // one per output
  std::vector<std::shared_ptr<std::vector<GradHook>>> output_hooks;  // tensor hooks, per output

 private:
  std::string name_;
  uint64_t sequence_nr_;
};

// The edge a tensor's gradient flows into: its grad_fn, its leaf accumulator, or none.
Edge gradient_edge(const Tensor& t);

}  // namespace octet::autograd
