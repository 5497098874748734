// mla/host_device.h — MLA_HOST_DEVICE marks functions compiled for the host and, under nvcc or
// hipcc, for the device too (shared definitions of the host code and the kernels).
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define MLA_HOST_DEVICE __host__ __device__
#else
#define MLA_HOST_DEVICE
#endif
