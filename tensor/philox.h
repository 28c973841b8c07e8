// Counter-based random numbers (Philox 4x32-10, Salmon et al., SC'11).
// The value at flat index i of a logical tensor depends only on
// (seed, stream, i): a rank can fill exactly its own shard of a parameter and
// get the bits the unsharded tensor would have had, on any world size, with no
// broadcast and no full materialisation.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

#include "tensor/host_device.h"
#include "tensor/portable_math.h"

namespace tessera {

// Names one independent random sequence: the seed of the run and a stream id
// (one per parameter, per dropout call, ...).
struct PhiloxKey {
  uint64_t seed = 0;
  uint64_t stream = 0;
};

// Which element of a key's sequence each element of a tensor takes (in
// logical order): element i takes first + (i / run) * stride + i % run. The
// default numbers the tensor 0, 1, 2, ...; a slice of a larger tensor takes
// its elements' indices in the whole, and so draws the whole's values there:
// a sequence shard [B, T/n, C] of [B, T, C] at slice s has run = T/n * C,
// stride = T * C and first = s * T/n * C.
struct PhiloxNumbering {
  uint64_t first = 0;
  int64_t run = 0;  // 0: one run of every element
  int64_t stride = 0;

  TESSERA_HOST_DEVICE uint64_t index(int64_t i) const {
    if (run == 0) return first + static_cast<uint64_t>(i);
    return first + static_cast<uint64_t>((i / run) * stride + i % run);
  }
};

// Ten rounds of Philox 4x32 on counter (index, stream) with key seed. Inline:
// fill loops call it once per element and must not pay a call for it. The
// cuda kernels call the same code, so a device fills the same bits.
TESSERA_HOST_DEVICE inline std::array<uint32_t, 4> philox4x32(PhiloxKey key, uint64_t index) {
  constexpr uint32_t kMultiplier0 = 0xD2511F53u;
  constexpr uint32_t kMultiplier1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u;
  constexpr uint32_t kWeyl1 = 0xBB67AE85u;
  std::array<uint32_t, 4> counter = {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                                     static_cast<uint32_t>(key.stream), static_cast<uint32_t>(key.stream >> 32)};
  uint32_t key0 = static_cast<uint32_t>(key.seed);
  uint32_t key1 = static_cast<uint32_t>(key.seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t product0 = static_cast<uint64_t>(kMultiplier0) * counter[0];
    const uint64_t product1 = static_cast<uint64_t>(kMultiplier1) * counter[2];
    const auto hi0 = static_cast<uint32_t>(product0 >> 32), lo0 = static_cast<uint32_t>(product0);
    const auto hi1 = static_cast<uint32_t>(product1 >> 32), lo1 = static_cast<uint32_t>(product1);
    counter = {hi1 ^ counter[1] ^ key0, lo1, hi0 ^ counter[3] ^ key1, lo0};
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
  return counter;
}

// Element i of the uniform [0, 1) sequence of `key` (24 random bits, so every
// value is exactly representable in f32).
TESSERA_HOST_DEVICE inline float philox_uniform(PhiloxKey key, uint64_t index) {
  return static_cast<float>(philox4x32(key, index)[0] >> 8) * (1.0f / 16777216.0f);
}

// Element i of the standard normal sequence of `key` (Box-Muller on two
// words). The logarithm and cosine are tessera's own, from exactly rounded
// operations, so every CPU, libm and GPU draws the same bits.
TESSERA_HOST_DEVICE inline double philox_normal(PhiloxKey key, uint64_t index) {
  const auto words = philox4x32(key, index);
  // u1 in (0, 1] so the log is finite; u2 in [0, 1).
  const double u1 = (static_cast<double>(words[0]) + 1.0) * (1.0 / 4294967296.0);
  const double u2 = static_cast<double>(words[1]) * (1.0 / 4294967296.0);
  const double radius_squared = -2.0 * portable_math::log(u1);
#if defined(__CUDA_ARCH__)
  return sqrt(radius_squared) * portable_math::cos_of_turns(u2);
#else
  return std::sqrt(radius_squared) * portable_math::cos_of_turns(u2);
#endif
}

// Hands out keys: a fixed seed and an increasing stream id. The global
// generator is what `rand`/`randn`/dropout use when no key is given.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  uint64_t seed() const { return seed_; }
  PhiloxKey next_key() { return PhiloxKey{seed_, next_stream_++}; }
  void manual_seed(uint64_t seed) {
    seed_ = seed;
    next_stream_ = 0;
  }
  // Position in the key sequence, for exact resume.
  uint64_t next_stream() const { return next_stream_; }
  void set_next_stream(uint64_t stream) { next_stream_ = stream; }

 private:
  uint64_t seed_;
  uint64_t next_stream_ = 0;
};

// This thread's default generator (each simulated rank has its own).
Generator& default_generator();
void manual_seed(uint64_t seed);

// A stable 64-bit id for a name (FNV-1a): parameters derive their init stream
// from their fully qualified name, so init does not depend on creation order.
uint64_t stream_id_for(const char* name, uint64_t salt = 0);

}  // namespace tessera
