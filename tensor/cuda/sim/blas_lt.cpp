// Placeholder until the simulator's cuBLASLt lands (issue 14).
