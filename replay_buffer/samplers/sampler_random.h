#ifndef SLUICE_REPLAY_BUFFER_SAMPLERS_SAMPLER_RANDOM_H_
#define SLUICE_REPLAY_BUFFER_SAMPLERS_SAMPLER_RANDOM_H_

#include <cstdint>
#include <random>

namespace sluice::replay_buffer {

// The random source of the random samplers: std::mt19937_64 seeded with the
// sampler's seed, plus our own conversions to doubles and bounded integers.
//
// Why not std::uniform_real_distribution / std::uniform_int_distribution or
// absl::BitGen: the standard leaves the distributions' algorithms to the
// library, and BitGen is deliberately unseedable and unstable across releases,
// so neither gives the same keys for the same seed on every platform and
// toolchain. mt19937_64's output sequence is fixed by the standard, and the two
// conversions below are plain integer arithmetic, so a seed replays exactly
// (same seed + same calls => same keys), on any platform.
//
// Copyable (copying forks the stream); not thread-safe.
class SamplerRandom {
 public:
  explicit SamplerRandom(uint64_t seed) : engine_(seed) {}

  // Uniform in [0, 1), on the grid k * 2^-53: the top 53 bits of one engine
  // output, so every representable value of the grid is equally likely and 1
  // is never returned.
  double Uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }

  // Uniform integer in [0, n), n > 0; unbiased (rejects the 2^64 mod n lowest
  // outputs, so the kept range is a whole number of copies of [0, n)).
  // Expected engine calls < 2.
  uint64_t UniformInt(uint64_t n) {
    const uint64_t threshold = (0 - n) % n;  // == 2^64 mod n
    uint64_t r = engine_();
    while (r < threshold) r = engine_();
    return r % n;
  }

 private:
  std::mt19937_64 engine_;
};

}  // namespace sluice::replay_buffer

#endif  // SLUICE_REPLAY_BUFFER_SAMPLERS_SAMPLER_RANDOM_H_
