// Counter-based random numbers (Philox 4x32-10, Salmon et al., SC'11).
// The value at flat index i of a logical tensor depends only on
// (seed, stream, i): a rank can fill exactly its own shard of a parameter and
// get the bits the unsharded tensor would have had, on any world size, with no
// broadcast and no full materialisation.
#pragma once

#include <array>
#include <cstdint>

namespace tessera {

// Names one independent random sequence: the seed of the run and a stream id
// (one per parameter, per dropout call, ...).
struct PhiloxKey {
  uint64_t seed = 0;
  uint64_t stream = 0;
};

// Ten rounds of Philox 4x32 on counter (index, stream) with key seed.
std::array<uint32_t, 4> philox4x32(PhiloxKey key, uint64_t index);

// Element i of the uniform [0, 1) sequence of `key` (24 random bits, so every
// value is exactly representable in f32).
float philox_uniform(PhiloxKey key, uint64_t index);
// Element i of the standard normal sequence of `key` (Box-Muller on two words).
double philox_normal(PhiloxKey key, uint64_t index);

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
