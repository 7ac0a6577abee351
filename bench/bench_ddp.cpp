// How much of DDP's gradient all-reduce hides behind backward. Launch it with mpirun:
//
//   mpirun -np 2 --oversubscribe build/bin/bench_ddp --model vit_small_patch16_224 --batch-size 4 --steps 5
//
// On the same model, batch and ranks it times backward (from loss.backward() until the averaged
// gradients are in .grad) three ways, taking the median over --steps after a warm-up step:
//   compute only  inside no_sync(): no communication at all
//   serial        DdpOptions::overlap = false: every bucket is reduced after backward has finished
//   overlapped    the default: each bucket is reduced as soon as its gradients are in
// The all-reduce time is serial − compute only; the part of it overlap hides is
// (serial − overlapped) / (serial − compute only). The reference, measured in the same run, is
// the serial schedule. Rank 0 prints the table and, with --json, writes it.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "autograd/ops.h"
#include "core/log.h"
#include "distributed/ddp.h"
#include "distributed/launch.h"
#include "kernels/threads.h"
#include "models/vit.h"

using namespace octet;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Options {
  std::string model = "vit_small_patch16_224";
  int64_t batch_size = 4;  // per rank
  int steps = 5;
  int threads = 0;
  double bucket_cap_mb = 25;
  std::string json;
};

enum class Mode { ComputeOnly, Serial, Overlapped };

// Median backward milliseconds (the same on every rank: each step ends with a barrier, and rank 0
// reports its own times).
double time_backward(const Options& o, std::shared_ptr<models::VisionTransformer> model,
                     const std::shared_ptr<distributed::ProcessGroup>& group, Mode mode, const Tensor& images,
                     const Tensor& labels) {
  distributed::DistributedDataParallel ddp(
      model, group,
      {.bucket_cap_mb = o.bucket_cap_mb, .broadcast_on_wrap = false, .overlap = mode == Mode::Overlapped});
  std::vector<double> ms;
  for (int step = 0; step <= o.steps; ++step) {
    for (Tensor p : model->parameters()) p.set_grad(Tensor());
    const Tensor loss = cross_entropy(ddp(images), labels);
    group->barrier()->wait();  // every rank starts backward together
    const auto start = Clock::now();
    if (mode == Mode::ComputeOnly) {
      auto no_sync = ddp.no_sync();
      loss.backward();
    } else {
      loss.backward();
    }
    const double elapsed = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    if (step > 0) ms.push_back(elapsed);  // step 0 warms up caches and the allocator
  }
  return median(ms);
}

int run(const Options& o) {
  const distributed::LaunchInfo launch = distributed::launch_info();
  kernels::set_num_threads(o.threads > 0 ? o.threads
                                         : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) /
                                                           launch.local_world_size));
  auto group = distributed::init_process_group(Device::cpu(), distributed::Backend::Mpi);
  Generator gen(1);
  const models::ViTConfig config = models::vit_config(o.model);
  auto model = std::make_shared<models::VisionTransformer>(config, true, &gen);
  Generator data_gen(100 + group->rank());
  const Tensor images = randn({o.batch_size, config.in_chans, config.img_size, config.img_size}, data_gen);
  std::vector<int64_t> y(o.batch_size);
  for (int64_t i = 0; i < o.batch_size; ++i) y[i] = i % config.num_classes;
  const Tensor labels = from_vector<int64_t>(y, {o.batch_size});

  const double compute = time_backward(o, model, group, Mode::ComputeOnly, images, labels);
  group->reset_counters();
  const double serial = time_backward(o, model, group, Mode::Serial, images, labels);
  const double bytes_per_step =
      static_cast<double>(group->counters().payload_of(distributed::Collective::AllReduce)) / (o.steps + 1);
  const double overlapped = time_backward(o, model, group, Mode::Overlapped, images, labels);
  const double comm = serial - compute, hidden = comm > 0 ? (serial - overlapped) / comm : 0.0;

  if (group->rank() == 0) {
    logging::info("{} on {} ranks ({}), batch {} per rank, {} parameters: {} all-reduced per step", o.model,
                  group->size(), group->backend(), o.batch_size, model->num_parameters(),
                  distributed::format_bytes(bytes_per_step));
    logging::info("backward, median of {} steps: compute only {:.1f} ms | serial {:.1f} ms | overlapped {:.1f} ms",
                  o.steps, compute, serial, overlapped);
    logging::info("all-reduce time {:.1f} ms, of which overlap hides {:.0f}%; overlapped ÷ serial = {:.3f}", comm,
                  100 * hidden, overlapped / serial);
    if (!o.json.empty()) {
      std::ofstream(o.json) << nlohmann::json{{"model", o.model},
                                              {"ranks", group->size()},
                                              {"backend", group->backend()},
                                              {"batch_per_rank", o.batch_size},
                                              {"allreduce_bytes_per_step", bytes_per_step},
                                              {"backward_compute_only_ms", compute},
                                              {"backward_serial_ms", serial},
                                              {"backward_overlapped_ms", overlapped},
                                              {"allreduce_ms", comm},
                                              {"hidden_fraction", hidden}}
                                   .dump(2)
                            << '\n';
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_ddp: how much of DDP's all-reduce overlaps backward (launch with mpirun)"};
  Options o;
  app.add_option("--model", o.model, "ViT config")->check(CLI::IsMember(models::vit_config_names()))->capture_default_str();
  app.add_option("--batch-size", o.batch_size, "images per rank")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--steps", o.steps, "timed steps per schedule")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--threads", o.threads, "CPU threads per rank (default: the node's cores / its ranks)");
  app.add_option("--bucket-cap-mb", o.bucket_cap_mb, "DDP bucket size")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--json", o.json, "also write the results to this JSON file (rank 0)");
  CLI11_PARSE(app, argc, argv);
  return distributed::run_rank_main([&] { return run(o); });
}
