#pragma once
// OCTET_HD marks functions that CPU code and CUDA kernels share (format conversions, Philox), so
// both sides compute the same bits from the same source.
#ifndef OCTET_HD
#if defined(__CUDACC__)
#define OCTET_HD __host__ __device__ __forceinline__
#else
#define OCTET_HD inline
#endif
#endif
