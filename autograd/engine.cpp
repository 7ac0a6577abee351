#include "autograd/engine.h"

#include <queue>
#include <unordered_map>

#include "autograd/node.h"
#include "core/grad_mode.h"
#include "kernels/elementwise.h"

namespace octet::autograd {

namespace {

// The gradients arriving at one node's outputs, summed as they come in.
struct InputBuffer {
  std::vector<Tensor> grads;
  void add(size_t slot, Tensor grad) {
    if (!grads[slot].defined()) {
      grads[slot] = std::move(grad);
    } else {
      grads[slot] = kernels::add(grads[slot], grad);
    }
  }
};

struct LaterFirst {
  bool operator()(const Node* a, const Node* b) const { return a->sequence_nr() < b->sequence_nr(); }
};

// Number of edges pointing at each node reachable from the roots.
std::unordered_map<Node*, int> count_dependencies(const std::vector<Edge>& roots) {
  std::unordered_map<Node*, int> deps;
  std::vector<Node*> stack;
  std::unordered_map<Node*, bool> seen;
  for (const Edge& e : roots) {
    if (!seen[e.node.get()]) {
      seen[e.node.get()] = true;
      stack.push_back(e.node.get());
    }
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const Edge& next : node->next_edges) {
      if (!next.node) continue;
      ++deps[next.node.get()];
      if (!seen[next.node.get()]) {
        seen[next.node.get()] = true;
        stack.push_back(next.node.get());
      }
    }
  }
  return deps;
}

// The callbacks of the backward passes running on this thread, innermost last (a backward may run
// inside another's hook, as gradcheck of a double backward would).
thread_local std::vector<std::vector<std::function<void()>>> pass_callbacks;

// Opens a callback list for one pass and closes it however the pass ends. A pass that is part of
// the one under way (backward_within_pass) keeps using that pass's list and runs none of it.
struct PassScope {
  explicit PassScope(bool own_callbacks) : own_(own_callbacks) {
    if (own_) pass_callbacks.emplace_back();
  }
  ~PassScope() {
    if (own_) pass_callbacks.pop_back();
  }
  PassScope(const PassScope&) = delete;
  PassScope& operator=(const PassScope&) = delete;

  // Runs the callbacks queued so far, and any they queue, in order.
  void run_callbacks() const {
    if (!own_) return;
    for (size_t i = 0; i < pass_callbacks.back().size(); ++i) {
      std::function<void()> callback = std::move(pass_callbacks.back()[i]);
      callback();
    }
  }

 private:
  bool own_;
};

void check_gradient(const Node& node, size_t j, const Tensor& grad) {
  const TensorMeta& want = node.input_meta[j];
  OCTET_CHECK(grad.shape() == want.shape && grad.dtype() == want.dtype && grad.device() == want.device, "backward of '",
              node.name(), "' returned gradient ", grad.describe(), " for input ", j, ", which is ",
              dtype_name(want.dtype), want.shape, " on ", want.device.str(), " (a bug in that op's backward)");
}

}  // namespace

namespace {

void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph,
                  bool own_callbacks) {
  OCTET_CHECK(grads.empty() || grads.size() == roots.size(), "backward: ", roots.size(), " roots but ", grads.size(),
              " gradients");
  std::vector<Edge> root_edges;
  std::vector<Tensor> root_grads;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& root = roots[i];
    OCTET_CHECK(root.requires_grad(), "backward: ", root.describe(),
                " does not require grad, so there is nothing to differentiate (was it computed under NoGradGuard, "
                "or from tensors without requires_grad_()?)");
    Tensor grad = grads.empty() ? Tensor() : grads[i];
    if (!grad.defined()) {
      OCTET_CHECK(root.numel() == 1, "backward: a gradient can only be implied for a one-element tensor; ",
                  root.describe(), " needs an explicit gradient of its shape");
      grad = ones(root.shape(), root.dtype(), root.device());
    }
    OCTET_CHECK(grad.shape() == root.shape() && grad.device() == root.device(), "backward: gradient ",
                grad.describe(), " does not match root ", root.describe(), "; pass one of the root's shape on ",
                "its device");
    root_edges.push_back(gradient_edge(root));
    root_grads.push_back(grad.detach().to(root.dtype()));
  }

  NoGradGuard no_grad;
  PassScope pass(own_callbacks);
  std::unordered_map<Node*, int> deps = count_dependencies(root_edges);
  std::unordered_map<Node*, InputBuffer> buffers;
  auto buffer_of = [&](Node* node) -> InputBuffer& {
    InputBuffer& b = buffers[node];
    if (b.grads.empty()) b.grads.resize(node->output_meta.size());
    return b;
  };
  // Keep every node alive while it waits, whatever the user does with their tensors.
  std::unordered_map<Node*, std::shared_ptr<Node>> owners;
  std::priority_queue<Node*, std::vector<Node*>, LaterFirst> ready;
  for (size_t i = 0; i < root_edges.size(); ++i) {
    Node* node = root_edges[i].node.get();
    owners[node] = root_edges[i].node;
    buffer_of(node).add(root_edges[i].input_nr, root_grads[i]);
  }
  for (auto& [node, owner] : owners) {
    if (deps[node] == 0) ready.push(node);
  }

  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    std::shared_ptr<Node> keep = owners[node];
    std::vector<Tensor> incoming = std::move(buffer_of(node).grads);
    buffers.erase(node);

    bool any_grad = false;
    for (size_t i = 0; i < incoming.size(); ++i) {
      if (!incoming[i].defined()) continue;
      any_grad = true;
      // A copy: a hook may register another on the same tensor. What a hook returns stands for the
      // gradient, so it must look like it.
      const std::vector<GradHook> hooks = *node->output_hooks[i];
      for (const GradHook& hook : hooks) {
        Tensor replaced = hook(incoming[i]);
        if (!replaced.defined()) continue;
        const TensorMeta& m = node->output_meta[i];
        OCTET_CHECK(replaced.shape() == m.shape && replaced.device() == m.device, "backward: a hook on output ", i,
                    " of '", node->name(), "' returned ", replaced.describe(), " for a gradient of shape ", m.shape,
                    " on ", m.device.str(), "; a hook that replaces a gradient must return one of its shape and device");
        incoming[i] = replaced.to(m.dtype);
      }
    }
    std::vector<Tensor> outgoing;
    if (any_grad) {
      for (size_t i = 0; i < incoming.size(); ++i) {
        if (!incoming[i].defined()) {
          const TensorMeta& m = node->output_meta[i];
          incoming[i] = zeros(m.shape, m.dtype, m.device);
        }
      }
      outgoing = node->apply(std::move(incoming));
      if (!retain_graph) node->release_saved();
      OCTET_CHECK(outgoing.empty() || outgoing.size() == node->next_edges.size(), "backward of '", node->name(),
                  "' returned ", outgoing.size(), " gradients for ", node->next_edges.size(), " inputs");
    }

    for (size_t j = 0; j < node->next_edges.size(); ++j) {
      const Edge& edge = node->next_edges[j];
      if (!edge.node) continue;
      Node* next = edge.node.get();
      owners.emplace(next, edge.node);
      if (j < outgoing.size() && outgoing[j].defined()) {
        check_gradient(*node, j, outgoing[j]);
        buffer_of(next).add(edge.input_nr, std::move(outgoing[j]));
      }
      if (--deps[next] == 0) ready.push(next);
    }
    owners.erase(node);
  }
  pass.run_callbacks();
}

}  // namespace

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph) {
  run_backward(roots, grads, retain_graph, /*own_callbacks=*/true);
}

void backward_within_pass(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads) {
  OCTET_CHECK(!pass_callbacks.empty(), "backward_within_pass: no backward pass is running on this thread; it is for "
              "a backward that is part of one under way (a recompute inside a node's backward), call backward()");
  run_backward(roots, grads, /*retain_graph=*/false, /*own_callbacks=*/false);
}

void queue_callback(std::function<void()> callback) {
  OCTET_CHECK(!pass_callbacks.empty(), "queue_callback: no backward pass is running on this thread; queue callbacks "
              "from a backward closure or a gradient hook, where the pass they wait for is under way");
  pass_callbacks.back().push_back(std::move(callback));
}

bool in_backward() { return !pass_callbacks.empty(); }

}  // namespace octet::autograd

namespace octet {

// Declared in core/tensor.h; lives here because the engine is autograd's.
void Tensor::backward(const Tensor& grad, bool retain_graph) const {
  autograd::backward({*this}, {grad}, retain_graph);
}

}  // namespace octet
