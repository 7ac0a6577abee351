#include "kernels/threads.h"

#include <cblas.h>
#include <omp.h>

#include "core/error.h"

namespace octet::kernels {

void set_num_threads(int threads) {
  OCTET_CHECK(threads >= 1, "set_num_threads: got ", threads, "; pass at least 1");
  omp_set_num_threads(threads);
  openblas_set_num_threads(1);
}

OpenBlasThreads::OpenBlasThreads(int threads) { openblas_set_num_threads(threads); }
OpenBlasThreads::~OpenBlasThreads() { openblas_set_num_threads(1); }

int num_threads() { return omp_get_max_threads(); }

}  // namespace octet::kernels
