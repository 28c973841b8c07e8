#!/usr/bin/env python3
"""Fits the polynomial coefficients of tensor/cpu/vector_math.h.

Each function is reduced to a smooth kernel on a short interval, and the kernel
is fitted by Chebyshev interpolation in 50-digit arithmetic (mpmath.chebyfit,
within a small factor of the minimax polynomial). It prints every kernel's
coefficients, lowest degree first, as float literals, and the fit's absolute
error, which must stay far below f32's 2^-24 = 6e-8 so that rounding, not the
approximation, sets the error of the result.

    pip install mpmath && python3 tools/fit_vector_math.py
"""
from mpmath import mp, mpf, chebyfit, erf, erfc, exp, factorial, log, sqrt, tanh

mp.dps = 50


def series(terms, z):
    """Sum of terms(k) z^k, k >= 0, to 50 digits (no cancellation near 0)."""
    total, k = mpf(0), 0
    while True:
        term = terms(k) * z**k
        total += term
        if k > 4 and abs(term) < mpf(10) ** -60:
            return total
        k += 1


KERNELS = [
    # exp(r) = 1 + r + r^2 q(r), |r| <= ln2 / 2 after r = x - n ln2.
    ("kExpKernel", lambda r: series(lambda k: 1 / factorial(k + 2), r), -log(2) / 2, log(2) / 2, 6),
    # log(1 + f) = 2 atanh(s) = 2s + s R(s^2), s = f / (2 + f), f in [sqrt(1/2) - 1, sqrt(2) - 1];
    # R(z) = z K(z) with K(z) = sum 2 z^k / (2k + 3).
    ("kLogKernel", lambda z: series(lambda k: mpf(2) / (2 * k + 3), z), 0, ((sqrt(2) - 1) / (sqrt(2) + 1)) ** 2, 4),
    # tanh(x) = x + x z P(z), z = x^2 <= 0.625^2.
    # tanh(x) = x + x z P(z), z = x^2 <= 0.625^2 (Chebyshev nodes are interior: z > 0).
    ("kTanhKernel", lambda z: (tanh(sqrt(z)) / sqrt(z) - 1) / z, 0, mpf("0.625") ** 2, 6),
    # erf(x) = x + x P(z), z = x^2 <= 1 (P(0) = 2/sqrt(pi) - 1: the leading x is exact).
    ("kErfKernel", lambda z: series(lambda k: 2 * (-1) ** k / (sqrt(mp.pi) * factorial(k) * (2 * k + 1)), z) - 1,
     0, 1, 8),
    # erfc(x) = exp(-x^2) erfcx(x), 1 <= x <= 3.95, erfcx as a polynomial in u = x - 2.5.
    ("kErfcxKernel", lambda u: exp((u + mpf("2.5")) ** 2) * erfc(u + mpf("2.5")), 1 - mpf("2.5"), mpf("3.95") - mpf("2.5"), 12),
]


def main():
    for name, kernel, low, high, count in KERNELS:
        coefficients, error = chebyfit(kernel, [mpf(low), mpf(high)], count, error=True)
        literals = ", ".join(f"{float(c):.9g}f" for c in reversed(coefficients))
        print(f"// degree {count - 1} on [{float(low):.6g}, {float(high):.6g}], fit error {float(error):.2e}")
        print(f"constexpr float {name}[] = {{{literals}}};")


if __name__ == "__main__":
    main()
