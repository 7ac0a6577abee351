// Trains a small MLP with the installed Octet's public API (nn::Module, nn::Linear, AdamW,
// cross-entropy, safetensors) and exits non-zero unless the loss falls and the saved weights load
// back unchanged. The labels come from a random "teacher" network, so a student can learn them.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "core/random.h"
#include "nn/layers.h"
#include "nn/safetensors.h"
#include "optim/optim.h"

using namespace octet;

namespace {

class Mlp : public nn::Module {
 public:
  Mlp(int64_t in, int64_t hidden, int64_t out) : Module("Mlp") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(in, hidden));
    act = register_module("act", std::make_shared<nn::GELU>());
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(hidden, out));
  }
  Tensor forward(const Tensor& x) override { return (*fc2)((*act)((*fc1)(x))); }

  std::shared_ptr<nn::Linear> fc1, fc2;
  std::shared_ptr<nn::GELU> act;
};

// Each row's label is the argmax of a fixed random linear map of it.
Tensor teacher_labels(const Tensor& x, int64_t classes, Generator& gen) {
  const int64_t n = x.size(0), d = x.size(1);
  const Tensor w = randn({classes, d}, gen);
  Tensor labels = empty({n}, DType::i64);
  for (int64_t i = 0; i < n; ++i) {
    int64_t best = 0;
    float best_score = -1e30f;
    for (int64_t c = 0; c < classes; ++c) {
      float score = 0;
      for (int64_t k = 0; k < d; ++k) score += w.data<float>()[c * d + k] * x.data<float>()[i * d + k];
      if (score > best_score) best = c, best_score = score;
    }
    labels.data<int64_t>()[i] = best;
  }
  return labels;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    manual_seed(0);  // the layers initialise from the default generator
    Generator gen(1);
    const int64_t samples = 128, features = 8, classes = 4;
    const Tensor x = randn({samples, features}, gen);
    const Tensor y = teacher_labels(x, classes, gen);

    Mlp model(features, 32, classes);
    optim::AdamW optimizer(optim::weight_decay_groups(model.named_parameters(), 1e-2, 1e-4), 1e-2);
    const nn::CrossEntropyLoss criterion;
    double first_loss = 0, last_loss = 0;
    for (int step = 0; step < 40; ++step) {
      optimizer.zero_grad();
      Tensor loss = criterion(model(x), y);
      loss.backward();
      optimizer.step();
      last_loss = loss.item();
      if (step == 0) first_loss = last_loss;
      if (step % 10 == 0) std::printf("step %2d  loss %.4f\n", step, last_loss);
    }
    std::printf("loss %.4f -> %.4f\n", first_loss, last_loss);
    if (!(last_loss < 0.7 * first_loss)) {
      std::fprintf(stderr, "FAIL: the loss did not fall by 30%%\n");
      return 1;
    }

    const std::string path =
        argc > 1 ? argv[1] : (std::filesystem::temp_directory_path() / "octet_consumer.safetensors").string();
    nn::save_safetensors(path, model.state_dict(), {{"step", "40"}});
    Mlp restored(features, 32, classes);
    restored.load_state_dict(nn::load_safetensors(path).tensors);
    NoGradGuard no_grad;
    const std::vector<float> expected = model(x).to_vector<float>(), got = restored(x).to_vector<float>();
    if (got != expected) {
      std::fprintf(stderr, "FAIL: the model reloaded from %s computes different logits\n", path.c_str());
      return 1;
    }
    std::printf("OK: trained, saved to %s and reloaded\n", path.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAIL: %s\n", e.what());
    return 1;
  }
}
