// Philox 4x32-10 and the derived uniform and normal sequences.
#include "tensor/philox.h"

#include <cmath>
#include <numbers>

namespace tessera {

namespace {
constexpr uint32_t kMultiplier0 = 0xD2511F53u;
constexpr uint32_t kMultiplier1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u;
constexpr uint32_t kWeyl1 = 0xBB67AE85u;

inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t product = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(product >> 32);
  lo = static_cast<uint32_t>(product);
}
}  // namespace

std::array<uint32_t, 4> philox4x32(PhiloxKey key, uint64_t index) {
  std::array<uint32_t, 4> counter = {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                                     static_cast<uint32_t>(key.stream), static_cast<uint32_t>(key.stream >> 32)};
  uint32_t key0 = static_cast<uint32_t>(key.seed);
  uint32_t key1 = static_cast<uint32_t>(key.seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kMultiplier0, counter[0], hi0, lo0);
    mulhilo(kMultiplier1, counter[2], hi1, lo1);
    counter = {hi1 ^ counter[1] ^ key0, lo1, hi0 ^ counter[3] ^ key1, lo0};
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
  return counter;
}

float philox_uniform(PhiloxKey key, uint64_t index) {
  uint32_t word = philox4x32(key, index)[0];
  return static_cast<float>(word >> 8) * (1.0f / 16777216.0f);
}

double philox_normal(PhiloxKey key, uint64_t index) {
  auto words = philox4x32(key, index);
  // u1 in (0, 1] so the log is finite; u2 in [0, 1).
  double u1 = (static_cast<double>(words[0]) + 1.0) * (1.0 / 4294967296.0);
  double u2 = static_cast<double>(words[1]) * (1.0 / 4294967296.0);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

Generator& default_generator() {
  thread_local Generator generator(0);
  return generator;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

uint64_t stream_id_for(const char* name, uint64_t salt) {
  uint64_t hash = 0xcbf29ce484222325ull ^ salt;
  for (const char* c = name; *c != '\0'; ++c) {
    hash ^= static_cast<unsigned char>(*c);
    hash *= 0x100000001b3ull;
  }
  return hash;
}

}  // namespace tessera
