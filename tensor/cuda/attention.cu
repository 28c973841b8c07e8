// Placeholder until the kernels land (issue 14).
