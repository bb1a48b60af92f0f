#ifndef SLUICE_COMMON_TASK_SHUFFLE_H_
#define SLUICE_COMMON_TASK_SHUFFLE_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

// Seeded randomness that gives the same result on every machine: only the
// raw output of std::mt19937_64 is used (std::shuffle and <random>'s
// distributions are implementation-defined), so a run's prompt order, task
// pool and splits are the same with libstdc++ and libc++.
namespace sluice::task {

// A uniform integer in [0, bound) (bound > 0), by rejection of the draws
// above the largest multiple of `bound`.
inline uint64_t UniformBelow(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t limit =
      std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % bound;
  uint64_t draw;
  do {
    draw = rng();
  } while (draw >= limit);
  return draw % bound;
}

// Fisher-Yates, from the last element down, with UniformBelow.
template <typename T>
void Shuffle(std::vector<T>& items, std::mt19937_64& rng) {
  for (size_t i = items.size(); i > 1; --i) {
    std::swap(items[i - 1], items[static_cast<size_t>(UniformBelow(rng, i))]);
  }
}

}  // namespace sluice::task

#endif  // SLUICE_COMMON_TASK_SHUFFLE_H_
