// A kernel source the simulator's unit generator must refuse: its
// `extern __shared__` array is declared at namespace scope.
extern __shared__ float staged[];

__global__ void uses_staged(float* out) { out[threadIdx.x] = staged[threadIdx.x]; }
