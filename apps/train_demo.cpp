// A first training program against Octet's C++ API: a two-layer MLP learns to tell apart the arms
// of a synthetic spiral, with autograd and a hand-written SGD step. It prints a falling loss and
// the final accuracy. (train_vit, the main job, replaces it once the ViT lands.)
#include <CLI/CLI.hpp>

#include <cmath>
#include <numbers>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "core/log.h"
#include "core/random.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"

using namespace octet;

namespace {

// `classes` interleaved spiral arms with Gaussian jitter; points [n, 2], labels [n].
std::pair<Tensor, Tensor> make_spirals(int64_t n, int64_t classes, Generator& gen) {
  const Tensor noise = randn({n, 2}, gen, DType::f32);
  const Tensor position = rand({n}, gen, DType::f32);
  Tensor points = empty({n, 2});
  Tensor labels = empty({n}, DType::i64);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = i % classes;
    const float t = position.data<float>()[i];
    const float angle = 4.0f * t + 2.0f * std::numbers::pi_v<float> * c / classes;
    points.data<float>()[2 * i] = t * std::cos(angle) + 0.05f * noise.data<float>()[2 * i];
    points.data<float>()[2 * i + 1] = t * std::sin(angle) + 0.05f * noise.data<float>()[2 * i + 1];
    labels.data<int64_t>()[i] = c;
  }
  return {points, labels};
}

struct Mlp {
  Tensor w1, b1, w2, b2;
  Mlp(int64_t in, int64_t hidden, int64_t out, Generator& gen) {
    // Uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)), as torch.nn.Linear initialises.
    auto init = [&](Shape shape, int64_t fan_in) {
      Tensor t = rand(shape, gen);
      const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
      return kernels::add_scalar(kernels::mul_scalar(t, 2 * bound), -bound).requires_grad_();
    };
    w1 = init({hidden, in}, in);
    b1 = init({hidden}, in);
    w2 = init({out, hidden}, hidden);
    b2 = init({out}, hidden);
  }
  Tensor forward(const Tensor& x) const { return linear(gelu(linear(x, w1, b1)), w2, b2); }
  std::vector<Tensor*> parameters() { return {&w1, &b1, &w2, &b2}; }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Octet demo: an MLP learns spirals with Octet's autograd"};
  int steps = 1500, hidden = 64, classes = 3, points = 1536, log_every = 100;
  double lr = 0.5;
  uint64_t seed = 0;
  app.add_option("--steps", steps, "optimizer steps")->check(CLI::PositiveNumber);
  app.add_option("--hidden", hidden, "hidden units")->check(CLI::PositiveNumber);
  app.add_option("--classes", classes, "spiral arms")->check(CLI::Range(2, 16));
  app.add_option("--points", points, "training points")->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "SGD learning rate")->check(CLI::PositiveNumber);
  app.add_option("--seed", seed, "random seed");
  app.add_option("--log-every", log_every, "steps between loss lines")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    Generator gen(seed);
    auto [x, y] = make_spirals(points, classes, gen);
    Mlp model(2, hidden, classes, gen);
    logging::info("training a 2-{}-{} MLP on {} spiral points for {} steps (lr {})", hidden, classes, points, steps, lr);
    for (int step = 1; step <= steps; ++step) {
      Tensor loss = cross_entropy(model.forward(x), y);
      for (Tensor* p : model.parameters()) p->set_grad(Tensor());
      loss.backward();
      {
        NoGradGuard no_grad;
        for (Tensor* p : model.parameters()) kernels::add_(*p, p->grad(), -lr);
      }
      if (step == 1 || step % log_every == 0 || step == steps) logging::info("step {:4d}  loss {:.4f}", step, loss.item());
    }
    NoGradGuard no_grad;
    const Tensor predicted = kernels::max(model.forward(x), 1).indices;
    int64_t correct = 0;
    for (int64_t i = 0; i < points; ++i) correct += predicted.data<int64_t>()[i] == y.data<int64_t>()[i];
    logging::info("train accuracy {:.1f}%", 100.0 * correct / points);
  } catch (const Error& e) {
    logging::error("{}", e.what());
    return 1;
  }
  return 0;
}
