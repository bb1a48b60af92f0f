#include "services/weights/weight_delta.h"

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/crc32c.h"

namespace sluice::weights {

namespace {

constexpr char kMagic[] = {'S', 'D', '\x01'};
constexpr size_t kMagicSize = sizeof(kMagic);

void PutVarint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void PutFixed32(std::string& out, uint32_t value) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

// Reads the delta front to back; every read is bounds-checked.
class Reader {
 public:
  explicit Reader(absl::string_view data) : data_(data) {}

  bool Varint(uint64_t* value) {
    uint64_t result = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= data_.size()) return false;
      const uint8_t byte = static_cast<uint8_t>(data_[pos_++]);
      result |= static_cast<uint64_t>(byte & 0x7F) << shift;
      if ((byte & 0x80) == 0) {
        *value = result;
        return true;
      }
    }
    return false;  // more than 10 bytes: not a varint
  }

  bool Fixed32(uint32_t* value) {
    if (data_.size() - pos_ < 4) return false;
    uint32_t result = 0;
    for (int i = 0; i < 4; ++i) {
      result |= static_cast<uint32_t>(static_cast<uint8_t>(data_[pos_ + i])) << (8 * i);
    }
    pos_ += 4;
    *value = result;
    return true;
  }

  bool Skip(absl::string_view expected) {
    if (data_.substr(pos_, expected.size()) != expected) return false;
    pos_ += expected.size();
    return true;
  }

  size_t remaining() const { return data_.size() - pos_; }
  const char* here() const { return data_.data() + pos_; }

 private:
  absl::string_view data_;
  size_t pos_ = 0;
};

absl::Status Corrupt(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("corrupt weight delta: ", what));
}

}  // namespace

absl::StatusOr<EncodedTensor> EncodeTensorDelta(absl::string_view base, absl::string_view target,
                                                const TensorDeltaOptions& options) {
  if (base.size() != target.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a delta between tensors of ", base.size(), " and ", target.size(), " bytes"));
  }
  if (target.size() % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a delta of 2-byte elements over ", target.size(), " bytes"));
  }
  const uint64_t n = target.size() / 2;
  const size_t limit = static_cast<size_t>(options.max_fraction_of_full * target.size());
  std::string runs;
  std::string values;
  uint64_t num_runs = 0;
  uint64_t next = 0;  // first element after the last run
  uint64_t i = 0;
  const char* b = base.data();
  const char* t = target.data();
  while (i < n) {
    // Equal stretches are the common case: skip them 4 elements at a time.
    while (i + 4 <= n && std::memcmp(b + 2 * i, t + 2 * i, 8) == 0) i += 4;
    while (i < n && std::memcmp(b + 2 * i, t + 2 * i, 2) == 0) ++i;
    if (i == n) break;
    uint64_t end = i + 1;
    while (end < n && std::memcmp(b + 2 * end, t + 2 * end, 2) != 0) ++end;
    const uint64_t length = end - i;
    PutVarint(runs, ((i - next) << 1) | (length > 1 ? 1 : 0));
    if (length > 1) PutVarint(runs, length - 2);
    values.append(t + 2 * i, 2 * length);
    ++num_runs;
    next = end;
    i = end;
    if (runs.size() + values.size() > limit) {
      return EncodedTensor{v1::TENSOR_ENCODING_FULL, std::string()};
    }
  }
  std::string out(kMagic, kMagicSize);
  PutFixed32(out, Crc32c(base));
  PutVarint(out, n);
  PutVarint(out, values.size() / 2);
  PutVarint(out, num_runs);
  out.append(runs);
  out.append(values);
  if (out.size() > limit) {
    return EncodedTensor{v1::TENSOR_ENCODING_FULL, std::string()};
  }
  return EncodedTensor{v1::TENSOR_ENCODING_SPARSE_DELTA, std::move(out)};
}

absl::StatusOr<std::string> ApplyTensorDelta(absl::string_view base, absl::string_view delta) {
  Reader in(delta);
  if (!in.Skip(absl::string_view(kMagic, kMagicSize))) {
    return Corrupt("it does not start with the sparse delta magic \"SD\\x01\"");
  }
  uint32_t base_crc = 0;
  uint64_t n = 0, num_changed = 0, num_runs = 0;
  if (!in.Fixed32(&base_crc) || !in.Varint(&n) || !in.Varint(&num_changed) ||
      !in.Varint(&num_runs)) {
    return Corrupt(absl::StrCat("its header is truncated (", delta.size(), " bytes)"));
  }
  if (base.size() % 2 != 0 || n != base.size() / 2) {
    return absl::DataLossError(absl::StrCat("weight delta is for a tensor of ", n,
                                            " elements; the base holds ", base.size(), " bytes"));
  }
  if (const uint32_t held = Crc32c(base); held != base_crc) {
    return absl::DataLossError(absl::StrFormat(
        "weight delta was made against a base with CRC32C %08x; the base held has %08x (wrong "
        "base version)",
        base_crc, held));
  }
  if (num_changed > n || num_runs > num_changed) {
    return Corrupt(absl::StrCat(num_changed, " changed elements in ", num_runs, " runs of a ", n,
                                "-element tensor"));
  }
  // Positions first; the values follow them, so check the sizes add up
  // before writing anything.
  std::string out(base);
  uint64_t next = 0, changed = 0;
  struct Run {
    uint64_t start, length;
  };
  std::vector<Run> run_list;
  run_list.reserve(static_cast<size_t>(num_runs));
  for (uint64_t r = 0; r < num_runs; ++r) {
    uint64_t token = 0, length = 1;
    if (!in.Varint(&token))
      return Corrupt(absl::StrCat("run ", r, " of ", num_runs, " is truncated"));
    if ((token & 1) != 0) {
      if (!in.Varint(&length)) {
        return Corrupt(absl::StrCat("run ", r, " of ", num_runs, " is truncated"));
      }
      if (length > n) return Corrupt(absl::StrCat("run ", r, " is longer than the tensor"));
      length += 2;
    }
    const uint64_t gap = token >> 1;
    if (gap > n - next || length > n - next - gap) {
      return Corrupt(absl::StrCat("run ", r, " reaches past element ", n, " of the tensor"));
    }
    const uint64_t start = next + gap;
    run_list.push_back({start, length});
    next = start + length;
    changed += length;
    if (changed > num_changed) {
      return Corrupt(absl::StrCat("its runs cover more than the ", num_changed,
                                  " changed elements it declares"));
    }
  }
  if (changed != num_changed) {
    return Corrupt(
        absl::StrCat("its runs cover ", changed, " elements, it declares ", num_changed));
  }
  if (in.remaining() != 2 * num_changed) {
    return Corrupt(absl::StrCat("it carries ", in.remaining(), " bytes of values for ", num_changed,
                                " changed elements"));
  }
  const char* values = in.here();
  for (const Run& run : run_list) {
    std::memcpy(out.data() + 2 * run.start, values, 2 * run.length);
    values += 2 * run.length;
  }
  return out;
}

absl::StatusOr<std::string> DecodeTensor(const v1::TensorSpec& spec, absl::string_view base,
                                         std::string encoded) {
  std::string bytes;
  switch (spec.encoding()) {
    case v1::TENSOR_ENCODING_UNSPECIFIED:
    case v1::TENSOR_ENCODING_FULL:
      bytes = std::move(encoded);
      break;
    case v1::TENSOR_ENCODING_SPARSE_DELTA: {
      absl::StatusOr<std::string> applied = ApplyTensorDelta(base, encoded);
      if (!applied.ok()) {
        return absl::DataLossError(
            absl::StrCat("tensor ", spec.name(), ": ", applied.status().message()));
      }
      bytes = *std::move(applied);
      break;
    }
    default:
      return absl::DataLossError(absl::StrCat("tensor ", spec.name(), ": unknown encoding ",
                                              static_cast<int>(spec.encoding())));
  }
  if (static_cast<int64_t>(bytes.size()) != spec.size_bytes()) {
    return absl::DataLossError(absl::StrCat("tensor ", spec.name(), " decodes to ", bytes.size(),
                                            " bytes, its manifest says ", spec.size_bytes()));
  }
  if (spec.has_crc32c() && Crc32c(bytes) != spec.crc32c()) {
    return absl::DataLossError(absl::StrCat("tensor ", spec.name(),
                                            " fails its CRC32C after decoding (",
                                            v1::TensorEncoding_Name(spec.encoding()), ")"));
  }
  return bytes;
}

}  // namespace sluice::weights
