// TESSERA_HOST_DEVICE marks a function that cuda kernels call too: nvcc
// compiles it for host and device, every other compiler sees a plain
// function (the simulator runs kernels on the host).
#pragma once

#if defined(__CUDACC__)
#define TESSERA_HOST_DEVICE __host__ __device__
#else
#define TESSERA_HOST_DEVICE
#endif
