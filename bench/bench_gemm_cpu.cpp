// CPU GEMM throughput: Octet's kernels::gemm next to OpenBLAS's cblas_sgemm called directly, on
// the same buffers and shapes in the same run. The two are timed in alternating blocks (ABABAB) so
// that frequency drift and the other core's load hit both alike; each figure is a median. Octet's
// GEMMs run on OpenMP threads with OpenBLAS single-threaded under each; the reference is OpenBLAS
// with its own thread pool, as a program calling cblas_sgemm gets it.
//
//   build/bin/bench_gemm_cpu [--reps N] [--json FILE]
#include <cblas.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/random.h"
#include "core/tensor.h"
#include "kernels/gemm.h"
#include "kernels/threads.h"

using namespace octet;

namespace {

struct Case {
  const char* name;
  int64_t m, n, k;
  bool trans_a, trans_b;
};

// Square sizes plus the three GEMMs of a Linear at the shapes of a small ViT step on the CPU
// (64 images x 50 tokens, width 192, MLP 768): fprop x·Wᵀ (NT), dgrad dy·W (NN), wgrad dyᵀ·x (TN).
const std::vector<Case> kCases = {
    {"square 256", 256, 256, 256, false, false},
    {"square 512", 512, 512, 512, false, false},
    {"square 1024", 1024, 1024, 1024, false, false},
    {"vit fc1 fprop (NT)", 3200, 768, 192, false, true},
    {"vit fc1 dgrad (NN)", 3200, 192, 768, false, false},
    {"vit fc1 wgrad (TN)", 768, 192, 3200, true, false},
    {"vit qkv fprop (NT)", 3200, 576, 192, false, true},
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"CPU GEMM: Octet's wrapper vs OpenBLAS called directly"};
  int reps = 15;
  std::string json_path;
  app.add_option("--reps", reps, "timed repetitions per shape and side")->check(CLI::PositiveNumber);
  app.add_option("--json", json_path, "also write the results as JSON");
  CLI11_PARSE(app, argc, argv);

  Generator gen(1);
  nlohmann::json results = nlohmann::json::array();
  std::printf("%-22s %18s %12s %12s %8s\n", "shape", "M x N x K", "octet GF/s", "openblas GF/s", "ratio");
  for (const Case& c : kCases) {
    const Tensor a = randn(c.trans_a ? Shape{c.k, c.m} : Shape{c.m, c.k}, gen);
    const Tensor b = randn(c.trans_b ? Shape{c.n, c.k} : Shape{c.k, c.n}, gen);
    Tensor out = zeros({c.m, c.n});
    const int lda = static_cast<int>(c.trans_a ? c.m : c.k), ldb = static_cast<int>(c.trans_b ? c.k : c.n);
    auto run_octet = [&] { kernels::gemm(a, c.trans_a, b, c.trans_b, out, 1.0, 0.0); };
    auto run_blas = [&] {
      const kernels::OpenBlasThreads blas_threads(kernels::num_threads());  // OpenBLAS with its own threads
      cblas_sgemm(CblasRowMajor, c.trans_a ? CblasTrans : CblasNoTrans, c.trans_b ? CblasTrans : CblasNoTrans,
                  static_cast<int>(c.m), static_cast<int>(c.n), static_cast<int>(c.k), 1.0f, a.data<float>(), lda,
                  b.data<float>(), ldb, 0.0f, out.data<float>(), static_cast<int>(c.n));
    };
    for (int w = 0; w < 2; ++w) {  // warm caches and OpenBLAS's thread pool
      run_octet();
      run_blas();
    }
    // Sides alternate in blocks of reps, with a pause at each switch: after a parallel region
    // OpenMP's workers spin for a while, and after a threaded call OpenBLAS's do (sched_yield), and
    // either would steal a core from the other side's first calls.
    std::vector<double> t_octet, t_blas;
    const int blocks = 3, per_block = std::max(1, reps / blocks);
    const auto settle = [] { std::this_thread::sleep_for(std::chrono::milliseconds(200)); };
    for (int blk = 0; blk < blocks; ++blk) {
      settle();
      for (int r = 0; r < per_block; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        run_octet();
        t_octet.push_back(seconds_since(t0));
      }
      settle();
      for (int r = 0; r < per_block; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        run_blas();
        t_blas.push_back(seconds_since(t0));
      }
    }
    const double flops = 2.0 * c.m * c.n * c.k;
    const double gf_octet = flops / median(t_octet) / 1e9, gf_blas = flops / median(t_blas) / 1e9;
    char dims[64];
    std::snprintf(dims, sizeof dims, "%ldx%ldx%ld", static_cast<long>(c.m), static_cast<long>(c.n), static_cast<long>(c.k));
    std::printf("%-22s %18s %12.1f %12.1f %8.3f\n", c.name, dims, gf_octet, gf_blas, gf_octet / gf_blas);
    results.push_back({{"shape", c.name}, {"m", c.m}, {"n", c.n}, {"k", c.k}, {"octet_gflops", gf_octet},
                       {"openblas_gflops", gf_blas}, {"ratio", gf_octet / gf_blas}});
  }
  if (!json_path.empty()) std::ofstream(json_path) << results.dump(2) << "\n";
  return 0;
}
