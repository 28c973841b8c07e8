// Tensor-core mma.m16n8k16 and ldmatrix as the simulator emulates them
// (tensor/cuda/mma.h): the fragment layouts against the PTX ISA's figures,
// every element of A, B and C landing where the layout puts it, exact
// results where the arithmetic is exact, an error bound that any hardware
// accumulation meets elsewhere, ldmatrix's addressing, and misuse named as
// the simulator names other warp-collective misuse.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tensor/cuda/mma_layout.h"
#include "tensor/cuda/sim/launch.h"
#include "tensor/error.h"
#include "tensor/float16_bits.h"
#include "tests/cuda/device_buffer.h"
#include "tests/cuda/expected_error.h"
#include "tests/cuda/mma_kernels.h"

using namespace tessera;
using namespace tessera::float16_bits;
using mma_kernels::Inputs;
using tessera::testing::contains;
using tessera::testing::error_of;

namespace {

constexpr bool kSimChecks = TESSERA_SIM_CHECKS != 0;


uint16_t to_bits(float value, Inputs inputs) {
  return inputs == Inputs::bf16 ? bfloat16_from_float(value) : half_from_float(value);
}
float from_bits(uint16_t bits, Inputs inputs) {
  return inputs == Inputs::bf16 ? float_from_bfloat16(bits) : float_from_half(bits);
}

// Tiles of D = A B + C as mma_from_memory takes them: a [16][16], b [8 n][16 k], c [16][8].
struct Tiles {
  int count;
  std::vector<uint16_t> a, b;
  std::vector<float> c;
  explicit Tiles(int tiles) : count(tiles), a(tiles * 256), b(tiles * 128), c(tiles * 128) {}
  uint16_t& a_at(int tile, int m, int k) { return a[tile * 256 + m * 16 + k]; }
  uint16_t& b_at(int tile, int k, int n) { return b[tile * 128 + n * 16 + k]; }
  float& c_at(int tile, int m, int n) { return c[tile * 128 + m * 8 + n]; }
};

std::vector<float> run_mma(const Tiles& tiles, Inputs inputs, int block_x, int block_y, int a_lane_flip = 0) {
  DeviceBuffer<uint16_t> a(tiles.a), b(tiles.b);
  DeviceBuffer<float> c(tiles.c), d(tiles.c.size());
  mma_kernels::mma_from_memory(a.get(), b.get(), c.get(), d.get(), tiles.count, inputs, block_x, block_y, a_lane_flip);
  return d.read();
}

// The exact C + sum_k A B of one element (16-bit products are exact in
// double; 17 terms in long double's 64 bits lose nothing at these ranges),
// and the sum of the terms' magnitudes.
std::pair<long double, long double> exact_element(Tiles& tiles, Inputs inputs, int tile, int m, int n) {
  long double sum = tiles.c_at(tile, m, n), magnitude = std::fabs(tiles.c_at(tile, m, n));
  for (int k = 0; k < 16; ++k) {
    const long double term = static_cast<long double>(from_bits(tiles.a_at(tile, m, k), inputs)) *
                             static_cast<long double>(from_bits(tiles.b_at(tile, k, n), inputs));
    sum += term;
    magnitude += std::fabs(term);
  }
  return {sum, magnitude};
}

// Four tiles whose D shows every element of one operand at a known place, all
// values distinct and exact in bf16 and f16: tile 0 A = I so D = B; tiles 1
// and 2 B selects A's columns n and n + 8 so D = A[:, 0:8] and A[:, 8:16];
// tile 3 A = 0 so D = C.
Tiles placement_tiles(Inputs inputs) {
  Tiles tiles(4);
  for (int m = 0; m < 16; ++m) {
    for (int k = 0; k < 16; ++k) {
      tiles.a_at(0, m, k) = to_bits(m == k ? 1.0f : 0.0f, inputs);
      tiles.a_at(1, m, k) = tiles.a_at(2, m, k) = to_bits(static_cast<float>(m * 16 + k + 1), inputs);
      tiles.a_at(3, m, k) = to_bits(0.0f, inputs);
    }
  }
  for (int k = 0; k < 16; ++k) {
    for (int n = 0; n < 8; ++n) {
      tiles.b_at(0, k, n) = to_bits(static_cast<float>(k * 8 + n + 1), inputs);
      tiles.b_at(1, k, n) = to_bits(k == n ? 1.0f : 0.0f, inputs);
      tiles.b_at(2, k, n) = to_bits(k == n + 8 ? 1.0f : 0.0f, inputs);
      tiles.b_at(3, k, n) = to_bits(static_cast<float>(k - n), inputs);
    }
  }
  for (int m = 0; m < 16; ++m) {
    for (int n = 0; n < 8; ++n) tiles.c_at(3, m, n) = -static_cast<float>(m * 8 + n + 1);
  }
  return tiles;
}

float placement_expected(Tiles& tiles, Inputs inputs, int tile, int m, int n) {
  switch (tile) {
    case 0: return from_bits(tiles.b_at(0, m, n), inputs);
    case 1: return from_bits(tiles.a_at(1, m, n), inputs);
    case 2: return from_bits(tiles.a_at(2, m, n + 8), inputs);
    default: return tiles.c_at(3, m, n);
  }
}

uint32_t pair(uint16_t low, uint16_t high) { return static_cast<uint32_t>(low) | static_cast<uint32_t>(high) << 16; }

}  // namespace

TEST_CASE("mma fragment layouts are the PTX ISA's (figures 79, 81 and 83 for m16n8k16)") {
  using cuda::mma_a_position, cuda::mma_accumulator_position, cuda::mma_b_position;
  const auto at = [](cuda::FragmentPosition position) { return std::pair(position.row, position.col); };
  // A: lane 0 holds (0,0) (0,1) (8,0) (8,1) (0,8) (0,9) (8,8) (8,9); lane 5 (group 1, thread 1) the same shifted.
  const std::vector<std::pair<int, int>> lane0 = {{0, 0}, {0, 1}, {8, 0}, {8, 1}, {0, 8}, {0, 9}, {8, 8}, {8, 9}};
  const std::vector<std::pair<int, int>> lane5 = {{1, 2}, {1, 3}, {9, 2}, {9, 3}, {1, 10}, {1, 11}, {9, 10}, {9, 11}};
  for (int element = 0; element < 8; ++element) {
    CHECK(at(mma_a_position(0, element)) == lane0[element]);
    CHECK(at(mma_a_position(5, element)) == lane5[element]);
  }
  CHECK(at(mma_a_position(31, 0)) == std::pair(7, 6));
  CHECK(at(mma_a_position(31, 7)) == std::pair(15, 15));
  // B (row k, col n): lane 0 holds k 0, 1, 8, 9 of column 0; lane 31 k 6, 7, 14, 15 of column 7.
  CHECK(at(mma_b_position(0, 0)) == std::pair(0, 0));
  CHECK(at(mma_b_position(0, 1)) == std::pair(1, 0));
  CHECK(at(mma_b_position(0, 2)) == std::pair(8, 0));
  CHECK(at(mma_b_position(0, 3)) == std::pair(9, 0));
  CHECK(at(mma_b_position(31, 0)) == std::pair(6, 7));
  CHECK(at(mma_b_position(31, 3)) == std::pair(15, 7));
  // C/D: lane 0 holds (0,0) (0,1) (8,0) (8,1); lane 31 (7,6) (7,7) (15,6) (15,7).
  CHECK(at(mma_accumulator_position(0, 2)) == std::pair(8, 0));
  CHECK(at(mma_accumulator_position(31, 1)) == std::pair(7, 7));
  CHECK(at(mma_accumulator_position(31, 3)) == std::pair(15, 7));
  // Each is a one-to-one map of (lane, element) onto the matrix.
  std::set<std::pair<int, int>> a_seen, b_seen, c_seen;
  for (int lane = 0; lane < 32; ++lane) {
    for (int element = 0; element < 8; ++element) a_seen.insert(at(mma_a_position(lane, element)));
    for (int element = 0; element < 4; ++element) {
      b_seen.insert(at(mma_b_position(lane, element)));
      c_seen.insert(at(mma_accumulator_position(lane, element)));
    }
  }
  CHECK(a_seen.size() == 256);
  CHECK(b_seen.size() == 128);
  CHECK(c_seen.size() == 128);
}

TEST_CASE("mma: every element of A, B and C reaches D where the PTX layout puts it, exactly") {
  for (const Inputs inputs : {Inputs::bf16, Inputs::f16}) {
    const std::string type = inputs == Inputs::bf16 ? "bf16" : "f16";
    CAPTURE(type);
    Tiles tiles = placement_tiles(inputs);
    // Two warps per block of 16 x 4 threads: lanes are linear thread indices mod 32.
    const std::vector<float> d = run_mma(tiles, inputs, 16, 4);
    int wrong = 0;
    for (int tile = 0; tile < 4; ++tile) {
      for (int m = 0; m < 16; ++m) {
        for (int n = 0; n < 8; ++n) wrong += d[tile * 128 + m * 8 + n] != placement_expected(tiles, inputs, tile, m, n);
      }
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("mma: a kernel that loads A as the wrong lane would is caught by those same checks") {
  Tiles tiles = placement_tiles(Inputs::bf16);
  for (const int flip : {1, 4, 16}) {  // a swapped thread-in-group, group, or half of the groups
    CAPTURE(flip);
    const std::vector<float> d = run_mma(tiles, Inputs::bf16, 32, 2, flip);
    int wrong = 0;
    for (int tile = 0; tile < 3; ++tile) {  // the tiles whose D shows A
      for (int m = 0; m < 16; ++m) {
        for (int n = 0; n < 8; ++n) {
          wrong += d[tile * 128 + m * 8 + n] != placement_expected(tiles, Inputs::bf16, tile, m, n);
        }
      }
    }
    CHECK(wrong == 3 * 128);  // every element that shows A
  }
}

TEST_CASE("mma on small integers is exact, bf16 and f16") {
  std::mt19937 random(14);
  std::uniform_int_distribution<int> small(-8, 8), accumulator(-64, 64);
  for (const Inputs inputs : {Inputs::bf16, Inputs::f16}) {
    const std::string type = inputs == Inputs::bf16 ? "bf16" : "f16";
    CAPTURE(type);
    Tiles tiles(8);
    for (uint16_t& value : tiles.a) value = to_bits(static_cast<float>(small(random)), inputs);
    for (uint16_t& value : tiles.b) value = to_bits(static_cast<float>(small(random)), inputs);
    for (float& value : tiles.c) value = static_cast<float>(accumulator(random));
    const std::vector<float> d = run_mma(tiles, inputs, 32, 4);
    int wrong = 0;
    for (int tile = 0; tile < tiles.count; ++tile) {
      for (int m = 0; m < 16; ++m) {
        for (int n = 0; n < 8; ++n) {
          // |sum| <= 64 + 16 * 64: every partial sum is an integer f32 holds exactly, in any order.
          wrong += d[tile * 128 + m * 8 + n] != static_cast<float>(exact_element(tiles, inputs, tile, m, n).first);
        }
      }
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("mma on random values: within what any f32 accumulation may lose, and the emulation rounds once") {
  std::mt19937 random(80);
  std::uniform_real_distribution<float> operand(-2.0f, 2.0f), accumulator(-4.0f, 4.0f);
  std::uniform_int_distribution<int> binade(-6, 6);
  for (const Inputs inputs : {Inputs::bf16, Inputs::f16}) {
    const std::string type = inputs == Inputs::bf16 ? "bf16" : "f16";
    CAPTURE(type);
    Tiles tiles(8);
    // Magnitudes over a few binades, so that the products do not all align.
    for (uint16_t& value : tiles.a) value = to_bits(std::ldexp(operand(random), binade(random)), inputs);
    for (uint16_t& value : tiles.b) value = to_bits(operand(random), inputs);
    for (float& value : tiles.c) value = accumulator(random);
    const std::vector<float> d = run_mma(tiles, inputs, 64, 1);
    double worst_ratio = 0;
    int outside_any = 0, outside_emulation = 0;
    for (int tile = 0; tile < tiles.count; ++tile) {
      for (int m = 0; m < 16; ++m) {
        for (int n = 0; n < 8; ++n) {
          const auto [exact, magnitude] = exact_element(tiles, inputs, tile, m, n);
          const long double error = std::fabs(d[tile * 128 + m * 8 + n] - exact);
          // Hardware: 16 additions and a rounding, each losing at most 2^-23
          // (truncation) of the running magnitude.
          const long double any_accumulation = 17 * std::ldexp(1.0L, -23) * magnitude;
          // The emulation: one rounding to f32 of an f64 sum.
          const long double one_rounding = std::ldexp(std::fabs(exact), -24) + std::ldexp(magnitude, -48);
          outside_any += error > any_accumulation;
          outside_emulation += error > one_rounding;
          worst_ratio = std::max(worst_ratio, static_cast<double>(error / any_accumulation));
        }
      }
    }
    CHECK(outside_any == 0);
    CHECK(outside_emulation == 0);
    MESSAGE("worst error / (17 * 2^-23 * sum |terms|): ", worst_ratio);
  }
}

TEST_CASE("ldmatrix_x4 and ldmatrix_x4_trans: lane 8m + r gives row r of matrix m, lane l gets the PTX ISA's elements") {
  const int rows = 40;
  std::vector<uint16_t> matrix(rows * 8);
  for (int i = 0; i < rows * 8; ++i) matrix[i] = static_cast<uint16_t>(i * 7 + 1000);  // distinct
  std::vector<int> row_of_lane(32);
  for (int lane = 0; lane < 32; ++lane) row_of_lane[lane] = (lane * 11 + 5) % rows;  // scattered, all different
  DeviceBuffer<uint16_t> device_matrix(matrix);
  DeviceBuffer<int> device_rows(row_of_lane);
  DeviceBuffer<uint32_t> out(32 * 8);
  const std::function<void()> load = [&] {
    mma_kernels::ldmatrix_rows(device_matrix.get(), rows, device_rows.get(), out.get());
  };
  const auto element = [&](int matrix_index, int row, int col) {
    return matrix[row_of_lane[matrix_index * 8 + row] * 8 + col];
  };
#if TESSERA_SIM_CHECKS
  cuda::sim::reset_kernel_counters();
  load();
  // The staging writes (rows x 16 bytes) and two ldmatrix.x4 of 32 rows x 16 bytes each.
  CHECK(cuda::sim::kernel_counters()["ldmatrix_rows_kernel"].shared_bytes_accessed == rows * 16 + 2 * 32 * 16);
#else
  load();
#endif
  const std::vector<uint32_t> registers = out.read();
  int wrong = 0;
  for (int lane = 0; lane < 32; ++lane) {
    const int group = lane / 4, in_group = lane % 4;
    for (int m = 0; m < 4; ++m) {
      wrong += registers[lane * 8 + m] != pair(element(m, group, 2 * in_group), element(m, group, 2 * in_group + 1));
      wrong += registers[lane * 8 + 4 + m] !=
               pair(element(m, 2 * in_group, group), element(m, 2 * in_group + 1, group));
    }
  }
  CHECK(wrong == 0);
  // Lane 0's first register: the first two elements of the row lane 0 gave; transposed, element 0 of the rows
  // lanes 0 and 1 gave. Lane 13's third: matrix 2 (lanes 16-23), row 3, elements 2 and 3.
  CHECK(registers[0] == pair(matrix[row_of_lane[0] * 8], matrix[row_of_lane[0] * 8 + 1]));
  CHECK(registers[4] == pair(matrix[row_of_lane[0] * 8], matrix[row_of_lane[1] * 8]));
  CHECK(registers[13 * 8 + 2] == pair(matrix[row_of_lane[19] * 8 + 2], matrix[row_of_lane[19] * 8 + 3]));
}

TEST_CASE("ldmatrix feeds mma: a 16x16 by 16x16 bf16 product through padded shared memory") {
  std::mt19937 random(800);
  std::uniform_int_distribution<int> small(-16, 16);
  std::uniform_real_distribution<float> real(-1.0f, 1.0f);
  for (const bool integers : {true, false}) {
    CAPTURE(integers);
    std::vector<uint16_t> a(256), b(256);
    for (uint16_t& value : a) value = bfloat16_from_float(integers ? static_cast<float>(small(random)) : real(random));
    for (uint16_t& value : b) value = bfloat16_from_float(integers ? static_cast<float>(small(random)) : real(random));
    DeviceBuffer<uint16_t> device_a(a), device_b(b);
    DeviceBuffer<float> d(256);
    mma_kernels::mma_through_ldmatrix(device_a.get(), device_b.get(), d.get());
    const std::vector<float> result = d.read();
    int wrong = 0;
    for (int m = 0; m < 16; ++m) {
      for (int n = 0; n < 16; ++n) {
        long double exact = 0, magnitude = 0;
        for (int k = 0; k < 16; ++k) {
          const long double term = static_cast<long double>(float_from_bfloat16(a[m * 16 + k])) *
                                   float_from_bfloat16(b[k * 16 + n]);
          exact += term;
          magnitude += std::fabs(term);
        }
        const long double error = std::fabs(result[m * 16 + n] - exact);
        wrong += integers ? error != 0 : error > 17 * std::ldexp(1.0L, -23) * magnitude;
      }
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("mma and ldmatrix misuse is named like other warp-collective misuse") {
  DeviceBuffer<float> out(32);
  // Lanes 16-31 return while the others wait at the instruction.
  std::string message = error_of([&] { mma_kernels::mma_by_half_a_warp(out.get()); });
  CHECK(contains(message, "mma_by_half_a_warp_kernel"));
  CHECK(contains(message, "mma.sync.aligned.m16n8k16"));
  CHECK(contains(message, "mma_kernels.cu:"));
  CHECK(contains(message, "lanes 0xffff0000 exited while the others waited"));

  message = error_of([&] { mma_kernels::mma_in_a_partial_warp(out.get()); });
  CHECK(contains(message, "mma_of_zeros_kernel"));
  CHECK(contains(message, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 at "));
  CHECK(contains(message, "needs all 32 lanes of warp 0, but only lanes 0x0000ffff are there"));

  message = error_of([&] { mma_kernels::mma_at_two_sites(out.get()); });
  CHECK(contains(message, "mma_at_two_sites_kernel"));
  CHECK(contains(message, "lanes of warp 0 disagree"));
  CHECK(contains(message, ".aligned"));

  DeviceBuffer<uint16_t> matrix(256);
  DeviceBuffer<uint32_t> registers(32);
  message = error_of([&] { mma_kernels::ldmatrix_from_device_memory(matrix.get(), registers.get()); });
  CHECK(contains(message, "ldmatrix.sync.aligned.m8n8.x4.shared.b16 at "));
  CHECK(contains(message, "is not 16 bytes of the block's shared memory"));

  message = error_of([&] { mma_kernels::ldmatrix_misaligned(registers.get()); });
  CHECK(contains(message, "is not 16-byte aligned"));
}

TEST_CASE("racecheck sees ldmatrix's reads: a neighbour's row needs a __syncwarp" * doctest::skip(!kSimChecks)) {
  DeviceBuffer<uint32_t> registers(32);
  const std::string message =
      error_of([&] { mma_kernels::ldmatrix_after_neighbour_writes(registers.get(), /*syncwarp=*/false); });
  CHECK(contains(message, "racecheck"));
  CHECK(contains(message, "ldmatrix_after_neighbour_writes_kernel"));
  CHECK(contains(message, "write-after-read hazard on dynamic shared memory"));

  mma_kernels::ldmatrix_after_neighbour_writes(registers.get(), /*syncwarp=*/true);
  const std::vector<uint32_t> values = registers.read();
  for (int lane = 0; lane < 32; ++lane) {
    // Register 0: row lane / 4 of matrix 0, whose address lane lane / 4 gave: row (lane / 4 + 1).
    const int row = lane / 4 + 1, col = 2 * (lane % 4);
    CHECK(values[lane] == pair(static_cast<uint16_t>(row * 8 + col), static_cast<uint16_t>(row * 8 + col + 1)));
  }
}
