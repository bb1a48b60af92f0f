// CRC32C combination: the CRC of A || B from crc(A), crc(B) and |B| alone,
// without the bytes of A. This is what lets the device CRC tree
// (device_crc_tree.cu) cut a 1 MiB chunk into pieces that threads CRC in
// parallel and still produce the chunk's ordinary CRC32C.
//
// The math (Mark Adler's, as in zlib's crc32_combine): a CRC is linear over
// GF(2), so crc(A || B) = crc(A) * x^(8|B|) mod P  xor  crc(B), where P is the
// reflected Castagnoli polynomial 0x82F63B78 and a 32-bit value is a
// polynomial with bit 31 as x^0. The pre- and post-inversions of the usual
// CRC32C cancel in this form, so it holds for the values Crc32c() returns.
//
// Header-only, with the same code for the host and for CUDA device code
// (SLUICE_HOST_DEVICE), so the host tests (crc32c_combine_test.cc) check the
// exact functions the kernel runs. Each function is pure and thread-safe.
#ifndef SLUICE_COMMON_CUDA_CRC32C_COMBINE_H_
#define SLUICE_COMMON_CUDA_CRC32C_COMBINE_H_

#include <cstdint>

#if defined(__CUDACC__)
#define SLUICE_HOST_DEVICE __host__ __device__
#else
#define SLUICE_HOST_DEVICE
#endif

namespace sluice {
namespace crc32c_math {

inline constexpr uint32_t kPolynomial = 0x82F63B78u;  // Castagnoli, reflected.
inline constexpr uint32_t kOne = 0x80000000u;         // The polynomial 1 (x^0).

// a * b mod P. 32 steps, branch-light (the device runs it in every thread).
SLUICE_HOST_DEVICE inline uint32_t MultiplyModP(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (int i = 0; i < 32; ++i) {
    // Bit 31 - i of `a` is the coefficient of x^i; `b` holds b * x^i.
    product ^= (0u - ((a >> (31 - i)) & 1u)) & b;
    b = (b >> 1) ^ ((0u - (b & 1u)) & kPolynomial);
  }
  return product;
}

// x^(8 * bytes) mod P: the operator that shifts a CRC past `bytes` zero bytes.
// O(log bytes) multiplications.
SLUICE_HOST_DEVICE inline uint32_t XPow8nModP(uint64_t bytes) {
  uint32_t result = kOne;
  uint32_t power = kOne >> 8;  // x^8: one byte.
  while (bytes != 0) {
    if (bytes & 1u) result = MultiplyModP(power, result);
    power = MultiplyModP(power, power);
    bytes >>= 1;
  }
  return result;
}

// crc(A || B) given crc(A), crc(B) and |B|; when many pieces share a length,
// compute XPow8nModP(length) once and use CombineWithShift.
SLUICE_HOST_DEVICE inline uint32_t CombineWithShift(uint32_t crc_a, uint32_t crc_b,
                                                    uint32_t shift_for_length_b) {
  return MultiplyModP(shift_for_length_b, crc_a) ^ crc_b;
}

SLUICE_HOST_DEVICE inline uint32_t Combine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b) {
  return CombineWithShift(crc_a, crc_b, XPow8nModP(length_b));
}

}  // namespace crc32c_math
}  // namespace sluice

#endif  // SLUICE_COMMON_CUDA_CRC32C_COMBINE_H_
