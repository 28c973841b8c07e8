// Placeholder until the cuBLASLt call lands (issue 14).
