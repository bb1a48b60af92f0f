#ifndef SLUICE_SERVICES_WEIGHTS_WEIGHT_DELTA_H_
#define SLUICE_SERVICES_WEIGHTS_WEIGHT_DELTA_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sluice/v1/common.pb.h"

namespace sluice::weights {

// Sparse deltas between two versions of one tensor of 2-byte elements
// (bfloat16 or float16 weights). In bf16 most elements are bit-identical
// from one optimizer step to the next (an Adam update smaller than half a
// bf16 ulp does not change the rounded value), so a version can travel as
// the positions and new values of the elements that changed. In float32
// every element changes at every step, hence deltas are for 2-byte dtypes
// only.
//
// The encoding (TENSOR_ENCODING_SPARSE_DELTA), all integers little-endian,
// varints as protobuf's (LEB128):
//
//   "SD" 0x01                    magic and format version
//   fixed32 base_crc32c          CRC32C of the base bytes it applies to
//   varint  num_elements         elements of the tensor (base and result)
//   varint  num_changed          elements the delta replaces
//   varint  num_runs             runs of consecutive changed elements
//   num_runs x:                  positions, in increasing order
//     varint (gap << 1) | long   gap = unchanged elements since the last run
//     [varint length - 2]        only when long; otherwise length 1
//   num_changed x 2 bytes        the new values, in position order
//
// A scattered change costs ~3 bytes (1-byte gap + value) against 2 per
// element sent in full; runs of changes cost ~2 bytes per element. Encoding
// and applying are single passes, O(n).

struct TensorDeltaOptions {
  // A delta larger than this fraction of the full tensor is not worth the
  // receiver's work (and the risk of a fallback): the tensor goes FULL.
  double max_fraction_of_full = 0.5;
};

struct EncodedTensor {
  v1::TensorEncoding encoding = v1::TENSOR_ENCODING_FULL;
  // The delta; empty for FULL (the target's own bytes travel).
  std::string bytes;
};

// Encodes `target` against `base` (the same number of 2-byte elements):
// SPARSE_DELTA when the delta is at most options.max_fraction_of_full of
// the target's size, else FULL (no bytes: send `target`). INVALID_ARGUMENT
// when the sizes differ or are odd. Thread-safe (pure).
absl::StatusOr<EncodedTensor> EncodeTensorDelta(absl::string_view base, absl::string_view target,
                                                const TensorDeltaOptions& options = {});

// The bytes `delta` (a SPARSE_DELTA encoding) makes of `base`. DATA_LOSS,
// never a crash, for a delta that is truncated, has trailing bytes, names a
// position outside the tensor, or was made against other base bytes (its
// base_crc32c). Thread-safe (pure).
absl::StatusOr<std::string> ApplyTensorDelta(absl::string_view base, absl::string_view delta);

// The tensor `spec` describes, from what came on the wire: `encoded` itself
// for FULL, else ApplyTensorDelta(base, encoded); then checked against
// spec.size_bytes and spec.crc32c (of the result). DATA_LOSS naming the
// tensor on any mismatch: the receiver fetches the full version instead.
absl::StatusOr<std::string> DecodeTensor(const v1::TensorSpec& spec, absl::string_view base,
                                         std::string encoded);

}  // namespace sluice::weights

#endif  // SLUICE_SERVICES_WEIGHTS_WEIGHT_DELTA_H_
