// nn::ModuleTracer: forward and backward spans per module call, on a small network with a real
// TransformerBlock inside, read back through trace::spans().
#include "nn/module_trace.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "core/grad_mode.h"
#include "core/trace.h"
#include "nn/layers.h"
#include "tests/testing.h"

namespace octet::nn {
namespace {

using octet::testing::random_tensor;
using octet::testing::throws_with;

// fc_in -> TransformerBlock -> head, on [B, N, 6] tokens.
class Net : public Module {
 public:
  Net() : Module("Net") {
    fc_in = register_module("fc_in", std::make_shared<Linear>(6, 8));
    block = register_module("block", std::make_shared<TransformerBlock>(8, 2));
    head = register_module("head", std::make_shared<Linear>(8, 3));
  }
  Tensor forward(const Tensor& x) override { return (*head)((*block)((*fc_in)(x))); }
  std::shared_ptr<Linear> fc_in;
  std::shared_ptr<TransformerBlock> block;
  std::shared_ptr<Linear> head;
};

// Every module of Net, by the label its spans carry (the root by its type).
const std::set<std::string> kAllLabels = {
    "Net", "fc_in", "block", "head",
    "block.norm1", "block.attn", "block.attn.qkv", "block.attn.proj", "block.attn.proj_drop", "block.drop_path1",
    "block.norm2", "block.mlp", "block.mlp.fc1", "block.mlp.act", "block.mlp.drop1", "block.mlp.fc2",
    "block.mlp.drop2", "block.drop_path2"};

struct Interval {
  int64_t start, end;
  bool contains(const Interval& other) const { return start <= other.start && other.end <= end; }
};

// Spans of one category by module label ("forward block.attn" -> "block.attn"), in recording order.
std::map<std::string, std::vector<Interval>> spans_of(const std::string& category) {
  std::map<std::string, std::vector<Interval>> out;
  for (const trace::Span& s : trace::spans()) {
    if (s.category != category) continue;
    EXPECT_EQ(s.track, "compute") << s.name;
    const std::string prefix = category + " ";
    EXPECT_EQ(s.name.substr(0, prefix.size()), prefix) << s.name;
    EXPECT_LE(s.start_us, s.end_us) << s.name;
    out[s.name.substr(prefix.size())].push_back({s.start_us, s.end_us});
  }
  return out;
}

std::set<std::string> labels_of(const std::map<std::string, std::vector<Interval>>& spans) {
  std::set<std::string> out;
  for (const auto& [label, intervals] : spans) out.insert(label);
  return out;
}

// The one span a label has; fails the test when there are none or several.
Interval only(const std::map<std::string, std::vector<Interval>>& spans, const std::string& label) {
  const auto it = spans.find(label);
  if (it == spans.end() || it->second.size() != 1) {
    ADD_FAILURE() << label << " has " << (it == spans.end() ? 0 : it->second.size()) << " spans, expected 1";
    return {0, 0};
  }
  return it->second[0];
}

// "block.attn.qkv" lies inside "block.attn", "block" and the root "Net".
bool is_ancestor(const std::string& parent, const std::string& child) {
  if (parent == child) return false;
  if (parent == "Net") return true;
  return child.size() > parent.size() && child.compare(0, parent.size() + 1, parent + ".") == 0;
}

void train_step(Module& net, const Tensor& x) {
  const Tensor loss = sum(net(x));
  loss.backward();
}

class ModuleTracerTest : public ::testing::Test {
 protected:
  void TearDown() override { trace::stop(); }
  Net net;
  // Not a leaf: the first module's backward then ends when this tensor's gradient is complete.
  Tensor leaf = random_tensor({2, 5, 6}, DType::f32, 7).requires_grad_();
  Tensor x = leaf * 2.0;
};

TEST_F(ModuleTracerTest, EveryCallGetsOneForwardAndOneBackwardSpan) {
  ModuleTracer tracer(net);
  EXPECT_EQ(tracer.traced_modules().size(), kAllLabels.size());
  trace::start(0);
  train_step(net, x);
  const auto forward = spans_of("forward");
  const auto backward = spans_of("backward");
  EXPECT_EQ(labels_of(forward), kAllLabels);
  EXPECT_EQ(labels_of(backward), kAllLabels);
  for (const std::string& label : kAllLabels) {
    EXPECT_EQ(forward.at(label).size(), 1u) << label;
    EXPECT_EQ(backward.at(label).size(), 1u) << label;
    EXPECT_LE(only(forward, label).end, only(backward, label).start) << label;
  }
}

TEST_F(ModuleTracerTest, ForwardSpansNestChildInsideParentAndFollowCallOrder) {
  ModuleTracer tracer(net);
  trace::start(0);
  train_step(net, x);
  const auto forward = spans_of("forward");
  for (const std::string& parent : kAllLabels) {
    for (const std::string& child : kAllLabels) {
      if (is_ancestor(parent, child)) {
        EXPECT_TRUE(only(forward, parent).contains(only(forward, child))) << child << " outside " << parent;
      }
    }
  }
  EXPECT_LE(only(forward, "fc_in").end, only(forward, "block").start);
  EXPECT_LE(only(forward, "block").end, only(forward, "head").start);
  EXPECT_LE(only(forward, "block.attn").end, only(forward, "block.mlp").start);
}

TEST_F(ModuleTracerTest, BackwardRunsLaterModulesFirstAndNestsChildrenInParents) {
  ModuleTracer tracer(net);
  trace::start(0);
  train_step(net, x);
  const auto backward = spans_of("backward");
  // Each module's backward starts once the one after it has handed back its input gradient.
  EXPECT_LE(only(backward, "head").end, only(backward, "block").start);
  EXPECT_LE(only(backward, "block").end, only(backward, "fc_in").start);
  EXPECT_LE(only(backward, "block.mlp").end, only(backward, "block.attn").start);
  EXPECT_LE(only(backward, "block.mlp.fc2").end, only(backward, "block.mlp.fc1").start);
  EXPECT_LT(only(backward, "head").start, only(backward, "fc_in").start);
  for (const std::string& parent : kAllLabels) {
    for (const std::string& child : kAllLabels) {
      if (is_ancestor(parent, child)) {
        EXPECT_TRUE(only(backward, parent).contains(only(backward, child))) << child << " outside " << parent;
      }
    }
  }
}

// Perfetto draws a track as a stack: two spans on it must be disjoint or one inside the other.
TEST_F(ModuleTracerTest, ComputeTrackIsProperlyNestedForPerfetto) {
  ModuleTracer tracer(net);
  trace::start(0);
  for (int step = 0; step < 3; ++step) train_step(net, leaf * 2.0);
  const std::vector<trace::Span> spans = trace::spans();
  ASSERT_EQ(spans.size(), 3 * 2 * kAllLabels.size());
  for (const trace::Span& a : spans) {
    for (const trace::Span& b : spans) {
      const bool disjoint = a.end_us <= b.start_us || b.end_us <= a.start_us;
      const bool nested = (a.start_us <= b.start_us && b.end_us <= a.end_us) ||
                          (b.start_us <= a.start_us && a.end_us <= b.end_us);
      EXPECT_TRUE(disjoint || nested) << a.name << " [" << a.start_us << ", " << a.end_us << "] and " << b.name
                                      << " [" << b.start_us << ", " << b.end_us << "] overlap without nesting";
    }
  }
}

// The input of fc_in is computed from `leaf` (x = 2·leaf), so fc_in's backward ends when x's gradient
// is complete: before the leaf's gradient is accumulated.
TEST_F(ModuleTracerTest, BackwardEndsWhenTheInputGradientIsComplete) {
  ModuleTracer tracer(net);
  int64_t leaf_accumulated_us = 0;
  leaf.register_post_accumulate_grad_hook([&](Tensor&) {
    leaf_accumulated_us = trace::now_us();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  });
  trace::start(0);
  train_step(net, x);
  const auto backward = spans_of("backward");
  ASSERT_GT(leaf_accumulated_us, 0);
  EXPECT_LE(only(backward, "fc_in").end, leaf_accumulated_us);
  EXPECT_LE(only(backward, "Net").end, leaf_accumulated_us);
}

// A leaf input (or one without grad) has no gradient hook to end the span, so it ends with the
// pass: after the leaf's accumulation, but before callbacks queued from gradient hooks (as DDP's).
TEST_F(ModuleTracerTest, FirstModuleEndsWithThePassBeforeLaterCallbacks) {
  for (const bool input_requires_grad : {true, false}) {
    SCOPED_TRACE(input_requires_grad ? "leaf input requiring grad" : "input without grad");
    Tensor input = random_tensor({2, 5, 6}, DType::f32, 8);
    if (input_requires_grad) input.requires_grad_();
    Net fresh;
    ModuleTracer tracer(fresh);
    int64_t callback_us = 0, fc_in_weight_accumulated_us = 0;
    fresh.head->weight.register_post_accumulate_grad_hook([&](Tensor&) {
      autograd::queue_callback([&] {
        callback_us = trace::now_us();
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      });
    });
    fresh.fc_in->weight.register_post_accumulate_grad_hook(
        [&](Tensor&) { fc_in_weight_accumulated_us = trace::now_us(); });
    trace::start(0);
    train_step(fresh, input);
    const auto backward = spans_of("backward");
    EXPECT_EQ(input.grad().defined(), input_requires_grad);
    ASSERT_GT(callback_us, 0);
    const Interval fc_in = only(backward, "fc_in");
    EXPECT_GE(fc_in.end, fc_in_weight_accumulated_us);  // its whole backward, parameters included
    EXPECT_LE(fc_in.end, callback_us);                   // not the wait queued after it
    EXPECT_LE(only(backward, "block").end, fc_in.start);
    EXPECT_TRUE(only(backward, "Net").contains(fc_in));
  }
}

// A module whose input has no gradient, inside a model whose input has one: its span ends with the
// pass, and still before a callback queued from a gradient hook that ran before its backward began.
TEST_F(ModuleTracerTest, PassEndRunsBeforeCallbacksQueuedEarlierInThePass) {
  class Embedded : public Module {
   public:
    Embedded() : Module("Embedded") {
      embed = register_module("embed", std::make_shared<Linear>(6, 8));
      head = register_module("head", std::make_shared<Linear>(8, 3));
    }
    Tensor forward(const Tensor& x) override { return (*head)(x + (*embed)(constant)); }
    std::shared_ptr<Linear> embed, head;
    Tensor constant = random_tensor({2, 5, 6}, DType::f32, 11);  // no grad
  } model;
  ModuleTracer tracer(model);
  int64_t callback_us = 0;
  model.head->weight.register_post_accumulate_grad_hook([&](Tensor&) {
    autograd::queue_callback([&] {
      callback_us = trace::now_us();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    });
  });
  trace::start(0);
  train_step(model, random_tensor({2, 5, 8}, DType::f32, 12).requires_grad_() * 1.0);
  const auto backward = spans_of("backward");
  ASSERT_GT(callback_us, 0);
  EXPECT_LE(only(backward, "head").end, only(backward, "embed").start);
  EXPECT_LE(only(backward, "embed").end, callback_us);
}

// A module called twice in one forward gets a span per call; the second call's backward comes first.
TEST_F(ModuleTracerTest, ModuleCalledTwiceGetsASpanPerCall) {
  class Twice : public Module {
   public:
    Twice() : Module("Twice") { lin = register_module("lin", std::make_shared<Linear>(4, 4)); }
    Tensor forward(const Tensor& x) override { return (*lin)((*lin)(x)); }
    std::shared_ptr<Linear> lin;
  } twice;
  ModuleTracer tracer(twice);
  trace::start(0);
  train_step(twice, random_tensor({3, 4}, DType::f32, 9).requires_grad_() * 1.0);
  const auto forward = spans_of("forward");
  const auto backward = spans_of("backward");
  ASSERT_EQ(forward.at("lin").size(), 2u);
  ASSERT_EQ(backward.at("lin").size(), 2u);
  const std::vector<Interval>& fwd = forward.at("lin");
  const std::vector<Interval>& bwd = backward.at("lin");  // recording order: second call first
  EXPECT_LE(fwd[0].end, fwd[1].start);
  EXPECT_LE(bwd[0].end, bwd[1].start);
  for (const Interval& i : fwd) EXPECT_TRUE(only(forward, "Twice").contains(i));
  for (const Interval& i : bwd) EXPECT_TRUE(only(backward, "Twice").contains(i));
}

TEST_F(ModuleTracerTest, DepthLimitsWhichModulesAreTraced) {
  {
    ModuleTracer tracer(net, 1);
    EXPECT_EQ(tracer.traced_modules(), (std::vector<std::string>{"", "fc_in", "block", "head"}));
    trace::start(0);
    train_step(net, leaf * 2.0);
    const std::set<std::string> depth_one = {"Net", "fc_in", "block", "head"};
    EXPECT_EQ(labels_of(spans_of("forward")), depth_one);
    EXPECT_EQ(labels_of(spans_of("backward")), depth_one);
  }
  {
    ModuleTracer tracer(net, 2);
    trace::start(0);
    train_step(net, leaf * 2.0);
    const std::set<std::string> labels = labels_of(spans_of("forward"));
    EXPECT_TRUE(labels.count("block.attn") && labels.count("block.mlp"));
    EXPECT_FALSE(labels.count("block.attn.qkv") || labels.count("block.mlp.fc1"));
    EXPECT_EQ(labels.size(), 10u);  // the root, 3 children, 6 children of block
  }
  {
    ModuleTracer tracer(net, 0);
    trace::start(0);
    train_step(net, leaf * 2.0);
    EXPECT_EQ(labels_of(spans_of("forward")), std::set<std::string>{"Net"});
  }
  EXPECT_TRUE(throws_with([&] { ModuleTracer bad(net, -2); }, {"ModuleTracer", "max_depth -2"}));
}

TEST_F(ModuleTracerTest, RemovedTracerRecordsNothing) {
  { ModuleTracer tracer(net); }
  trace::start(0);
  train_step(net, leaf * 2.0);
  EXPECT_TRUE(trace::spans().empty());

  // Removed between forward and backward: the gradient hooks left on the graph stay silent.
  ModuleTracer tracer(net);
  trace::start(0);
  const Tensor loss = sum(net(leaf * 2.0));
  tracer.remove();
  EXPECT_TRUE(tracer.traced_modules().empty());
  loss.backward();
  EXPECT_EQ(labels_of(spans_of("forward")), kAllLabels);
  EXPECT_TRUE(spans_of("backward").empty());
  tracer.remove();  // twice is harmless

  // A new tracer sees one span per call: the old hooks are gone, not doubled.
  ModuleTracer again(net);
  trace::start(0);
  train_step(net, leaf * 2.0);
  EXPECT_EQ(trace::spans().size(), 2 * kAllLabels.size());
}

TEST_F(ModuleTracerTest, RecordingOffRecordsNothingAndLeavesNoStaleState) {
  ModuleTracer tracer(net);
  trace::start(0);
  trace::stop();
  train_step(net, leaf * 2.0);
  EXPECT_TRUE(trace::spans().empty());

  // Stopped between forward and backward: no backward spans.
  trace::start(0);
  const Tensor loss = sum(net(leaf * 2.0));
  trace::stop();
  loss.backward();
  EXPECT_TRUE(spans_of("backward").empty());

  // Stopped mid-forward, then started mid-forward (by hooks on mlp that run after the tracer's):
  // a call whose start was not recorded gets no span, and no start left over from the interrupted
  // step is taken for it.
  trace::start(0);
  const size_t stopper = net.block->mlp->register_forward_pre_hook([](Module&, const Tensor&) -> Tensor {
    trace::stop();
    return {};
  });
  train_step(net, leaf * 2.0);
  net.block->mlp->remove_hook(stopper);
  int64_t restarted_us = 0;
  const size_t starter = net.block->mlp->register_forward_pre_hook([&](Module&, const Tensor&) -> Tensor {
    trace::start(0);
    restarted_us = trace::now_us();
    return {};
  });
  train_step(net, leaf * 2.0);
  net.block->mlp->remove_hook(starter);
  const auto forward = spans_of("forward");
  EXPECT_EQ(labels_of(forward), (std::set<std::string>{"block.mlp.fc1", "block.mlp.act", "block.mlp.drop1",
                                                       "block.mlp.fc2", "block.mlp.drop2", "block.drop_path2",
                                                       "head"}));
  for (const trace::Span& s : trace::spans()) EXPECT_GE(s.start_us, restarted_us) << s.name;
}

TEST_F(ModuleTracerTest, NoGradForwardRecordsForwardOnly) {
  ModuleTracer tracer(net);
  trace::start(0);
  {
    NoGradGuard no_grad;
    net(x);
  }
  EXPECT_EQ(labels_of(spans_of("forward")), kAllLabels);
  EXPECT_TRUE(spans_of("backward").empty());
}

// The hooks hold names and times only: a module's output has as many owners with the tracer as without.
TEST_F(ModuleTracerTest, HooksKeepNoTensorAlive) {
  auto owners_of_block_output = [&](bool traced) {
    std::unique_ptr<ModuleTracer> tracer = traced ? std::make_unique<ModuleTracer>(net) : nullptr;
    Tensor block_output;
    const size_t keep = net.block->register_forward_hook([&](Module&, const Tensor&, const Tensor& out) -> Tensor {
      block_output = out;
      return {};
    });
    trace::start(0);
    const Tensor loss = sum(net(leaf * 2.0));
    const long during_forward = block_output.use_count();
    loss.backward();
    net.block->remove_hook(keep);
    return std::make_pair(during_forward, block_output.use_count());
  };
  const auto untraced = owners_of_block_output(false);
  const auto traced = owners_of_block_output(true);
  EXPECT_EQ(traced, untraced);
  EXPECT_FALSE(trace::spans().empty());
}

}  // namespace
}  // namespace octet::nn
