// The smallest useful training program against Octet's C++ API: a Vision Transformer learns
// Fashion-MNIST. Everything train_vit adds (flags, schedules, checkpoints, metrics) is left out.
//
//   build/bin/minimal_train [steps]       (default: one epoch, 468 steps of 128 images)
#include <cstdio>
#include <string>

#include "autograd/grad_mode.h"
#include "data/fashion_mnist.h"
#include "data/loader.h"
#include "kernels/reduce.h"
#include "models/vit.h"
#include "nn/layers.h"
#include "optim/optim.h"

using namespace octet;

int main(int argc, char** argv) {
  try {
    std::shared_ptr<const data::Dataset> train = data::load_fashion_mnist("", /*train=*/true);
    std::shared_ptr<const data::Dataset> test = data::load_fashion_mnist("", /*train=*/false);
    data::DataLoader train_loader(train, {.batch_size = 128, .shuffle = true, .seed = 0});
    const int64_t steps = argc > 1 ? std::stoll(argv[1]) : train_loader.batches_per_epoch();

    manual_seed(0);
    models::VisionTransformer model(models::vit_config("vit_fashion_mnist"));
    optim::AdamW optimizer(optim::weight_decay_groups(model.named_parameters(), 1e-3, 0.05), 1e-3);
    nn::CrossEntropyLoss criterion(/*label_smoothing=*/0.1);

    for (int64_t step = 1; step <= steps; ++step) {
      const data::Batch batch = train_loader.next();
      const Tensor loss = criterion(model(batch.images), batch.labels);
      loss.backward();
      optimizer.step();
      optimizer.zero_grad();
      if (step % 50 == 0 || step == steps) std::printf("step %4lld  loss %.4f\n", (long long)step, loss.item());
    }

    // Test accuracy: no graph, dropout off, every test image once.
    NoGradGuard no_grad;
    model.eval();
    data::DataLoader test_loader(test, {.batch_size = 1000, .shuffle = false, .drop_last = false});
    int64_t correct = 0;
    for (int64_t b = 0; b < test_loader.batches_per_epoch(); ++b) {
      const data::Batch batch = test_loader.next();
      const Tensor predicted = kernels::max(model(batch.images), 1).indices;
      for (int64_t i = 0; i < batch.labels.numel(); ++i)
        correct += predicted.data<int64_t>()[i] == batch.labels.data<int64_t>()[i];
    }
    std::printf("test accuracy %.2f%%\n", 100.0 * static_cast<double>(correct) / static_cast<double>(test->size()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
