#include "common/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace sluice::model {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";
// transformers refuses headers above 100 MB; so do we, before allocating.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// product(shape) * item_size, or an error on a negative dimension or overflow.
absl::StatusOr<int64_t> ByteSize(const std::vector<int64_t>& shape, int64_t item_size) {
  int64_t bytes = item_size;
  for (int64_t dim : shape) {
    if (dim < 0) return absl::InvalidArgumentError(absl::StrCat("negative dimension ", dim));
    if (__builtin_mul_overflow(bytes, dim, &bytes)) {
      return absl::InvalidArgumentError(absl::StrCat("shape ", ShapeString(shape), " overflows"));
    }
  }
  return bytes;
}

absl::Status Invalid(const std::string& path, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat("safetensors file ", path, ": ", message));
}

// Parses one tensor entry of the header (without data, which needs the
// mapping) into `view`, returning its [begin, end) offsets.
absl::StatusOr<std::pair<uint64_t, uint64_t>> ParseEntry(const std::string& name,
                                                         const Json& entry, TensorView& view) {
  if (!entry.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("expected an object, got ", entry.dump()));
  }
  auto dtype = entry.find("dtype");
  if (dtype == entry.end() || !dtype->is_string()) {
    return absl::InvalidArgumentError("\"dtype\" missing or not a string");
  }
  absl::StatusOr<DType> parsed = ParseDType(dtype->get<std::string>());
  if (!parsed.ok()) return parsed.status();
  view.dtype = *parsed;
  auto shape = entry.find("shape");
  if (shape == entry.end() || !shape->is_array()) {
    return absl::InvalidArgumentError("\"shape\" missing or not a list");
  }
  for (const Json& dim : *shape) {
    if (!dim.is_number_integer() || dim.get<int64_t>() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"shape\" must hold non-negative integers, got ", shape->dump()));
    }
    view.shape.push_back(dim.get<int64_t>());
  }
  auto offsets = entry.find("data_offsets");
  if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
    return absl::InvalidArgumentError(
        "\"data_offsets\" missing or not two non-negative integers");
  }
  const uint64_t begin = (*offsets)[0].get<uint64_t>();
  const uint64_t end = (*offsets)[1].get<uint64_t>();
  if (end < begin) {
    return absl::InvalidArgumentError(
        absl::StrCat("data_offsets [", begin, ", ", end, "] end before they begin"));
  }
  absl::StatusOr<int64_t> bytes = ByteSize(view.shape, DTypeSize(view.dtype));
  if (!bytes.ok()) return bytes.status();
  if (static_cast<uint64_t>(*bytes) != end - begin) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape ", ShapeString(view.shape), " of ", DTypeName(view.dtype), " needs ", *bytes,
        " bytes, data_offsets [", begin, ", ", end, "] hold ", end - begin));
  }
  (void)name;
  return std::make_pair(begin, end);
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& header,
                                 const std::vector<const TensorToWrite*>& tensors) {
  const std::string temp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (!out) return absl::InternalError(absl::StrCat("cannot create ", temp, ": ", std::strerror(errno)));
    uint8_t length[8];
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(n >> (8 * i));
    out.write(reinterpret_cast<const char*>(length), 8);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    for (const TensorToWrite* tensor : tensors) {
      out.write(tensor->data.data(), static_cast<std::streamsize>(tensor->data.size()));
    }
    out.flush();
    if (!out) {
      out.close();
      std::remove(temp.c_str());
      return absl::InternalError(absl::StrCat("cannot write ", temp));
    }
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    std::remove(temp.c_str());
    return absl::InternalError(
        absl::StrCat("cannot rename ", temp, " to ", path, ": ", std::strerror(error)));
  }
  return absl::OkStatus();
}

// Checks `tensors` and returns them sorted by name.
absl::StatusOr<std::vector<const TensorToWrite*>> SortedChecked(
    const std::vector<TensorToWrite>& tensors) {
  std::vector<const TensorToWrite*> sorted;
  for (const TensorToWrite& tensor : tensors) sorted.push_back(&tensor);
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorToWrite* a, const TensorToWrite* b) { return a->name < b->name; });
  for (size_t i = 0; i < sorted.size(); ++i) {
    const TensorToWrite& tensor = *sorted[i];
    if (tensor.name.empty() || tensor.name == "__metadata__") {
      return absl::InvalidArgumentError(absl::StrCat("invalid tensor name \"", tensor.name, "\""));
    }
    if (i > 0 && sorted[i - 1]->name == tensor.name) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", tensor.name, "\" given twice"));
    }
    absl::StatusOr<int64_t> bytes = ByteSize(tensor.shape, DTypeSize(tensor.dtype));
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", tensor.name, "\": ", bytes.status().message()));
    }
    if (static_cast<uint64_t>(*bytes) != tensor.data.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", tensor.name, "\": shape ", ShapeString(tensor.shape), " of ",
          DTypeName(tensor.dtype), " needs ", *bytes, " bytes, got ", tensor.data.size()));
    }
  }
  return sorted;
}

absl::Status WriteSorted(const std::string& path, const std::vector<const TensorToWrite*>& sorted,
                         const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorToWrite* tensor : sorted) {
    const uint64_t end = offset + tensor->data.size();
    header[tensor->name] = {{"dtype", std::string(DTypeName(tensor->dtype))},
                            {"shape", tensor->shape},
                            {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return WriteFileAtomically(path, text, sorted);
}

}  // namespace

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kI64: return "I64";
    case DType::kI32: return "I32";
  }
  return "?";
}

int64_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kI64: return 8;
    case DType::kI32: return 4;
  }
  return 0;
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  if (name == "I64") return DType::kI64;
  if (name == "I32") return DType::kI32;
  return absl::InvalidArgumentError(absl::StrCat(
      "unsupported dtype \"", std::string(name), "\" (supported: F32, BF16, F16, I64, I32)"));
}

int64_t TensorView::num_elements() const {
  int64_t n = 1;
  for (int64_t dim : shape) n *= dim;
  return n;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    const std::string message = absl::StrCat("cannot open ", path, ": ", std::strerror(error));
    return error == ENOENT ? absl::NotFoundError(message) : absl::InvalidArgumentError(message);
  }
  struct stat info;
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    return Invalid(path, "not a regular file");
  }
  const uint64_t file_size = static_cast<uint64_t>(info.st_size);
  if (file_size < 8) {
    ::close(fd);
    return Invalid(path, absl::StrCat("file is ", file_size,
                                      " bytes, too short for the 8-byte header length"));
  }
  void* mapping = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapping == MAP_FAILED) {
    return Invalid(path, absl::StrCat("mmap failed: ", std::strerror(errno)));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->mapping_ = mapping;
  file->mapping_size_ = file_size;
  const uint8_t* bytes = static_cast<const uint8_t*>(mapping);

  uint64_t header_size = 0;
  for (int i = 0; i < 8; ++i) header_size |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  if (header_size > file_size - 8) {
    return Invalid(path, absl::StrCat("header length ", header_size,
                                      " (bytes 0..7) runs past the end of the file at byte ",
                                      file_size));
  }
  if (header_size > kMaxHeaderBytes) {
    return Invalid(path, absl::StrCat("header length ", header_size, " exceeds the limit of ",
                                      kMaxHeaderBytes));
  }
  const char* header_begin = reinterpret_cast<const char*>(bytes + 8);
  Json header = Json::parse(header_begin, header_begin + header_size, nullptr,
                            /*allow_exceptions=*/false);
  if (header.is_discarded()) {
    return Invalid(path, absl::StrCat("the header (bytes 8..", 8 + header_size,
                                      ") is not valid JSON"));
  }
  if (!header.is_object()) return Invalid(path, "the header is not a JSON object");

  const uint64_t data_begin = 8 + header_size;
  const uint64_t data_size = file_size - data_begin;
  std::vector<std::pair<std::pair<uint64_t, uint64_t>, size_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return Invalid(path, "\"__metadata__\" is not an object");
      for (auto meta = it->begin(); meta != it->end(); ++meta) {
        if (!meta->is_string()) {
          return Invalid(path, absl::StrCat("\"__metadata__\" value of \"", meta.key(),
                                            "\" is not a string"));
        }
        file->metadata_[meta.key()] = meta->get<std::string>();
      }
      continue;
    }
    TensorView view;
    view.name = it.key();
    absl::StatusOr<std::pair<uint64_t, uint64_t>> range = ParseEntry(view.name, *it, view);
    if (!range.ok()) {
      return Invalid(path, absl::StrCat("tensor \"", view.name, "\": ", range.status().message()));
    }
    if (range->second > data_size) {
      return Invalid(path, absl::StrCat("tensor \"", view.name, "\": data_offsets [",
                                        range->first, ", ", range->second,
                                        "] run past the end of the data region (", data_size,
                                        " bytes from byte ", data_begin, "; file truncated?)"));
    }
    view.data = absl::MakeConstSpan(bytes + data_begin + range->first,
                                    range->second - range->first);
    ranges.push_back({*range, file->tensors_.size()});
    file->tensors_.push_back(std::move(view));
  }
  std::sort(ranges.begin(), ranges.end());
  // The non-empty range reaching furthest so far; empty tensors occupy no
  // bytes and overlap nothing.
  uint64_t reach = 0;
  size_t reach_index = 0;
  for (const auto& [range, index] : ranges) {
    if (range.first == range.second) continue;
    if (range.first < reach) {
      const TensorView& other = file->tensors_[reach_index];
      return Invalid(path, absl::StrCat("tensor \"", file->tensors_[index].name,
                                        "\" (data_offsets [", range.first, ", ", range.second,
                                        "]) overlaps tensor \"", other.name, "\""));
    }
    reach = range.second;
    reach_index = index;
  }
  // nlohmann's object is a std::map: tensors_ is already sorted by name.
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_size_);
}

const TensorView* SafetensorsFile::Find(absl::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorView& view, absl::string_view key) {
                               return absl::string_view(view.name) < key;
                             });
  if (it == tensors_.end() || it->name != name) return nullptr;
  return &*it;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> names;
  for (const TensorView& view : tensors_) names.push_back(view.name);
  return names;
}

absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::Open(
    const std::string& dir) {
  auto checkpoint = std::unique_ptr<SafetensorsCheckpoint>(new SafetensorsCheckpoint());
  const fs::path single = fs::path(dir) / kSingleFile;
  const fs::path index_path = fs::path(dir) / kIndexFile;
  std::error_code error;
  if (fs::exists(single, error)) {
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(single.string());
    if (!file.ok()) return file.status();
    for (const TensorView& view : (*file)->tensors()) checkpoint->index_[view.name] = &view;
    checkpoint->files_.push_back(*std::move(file));
    return checkpoint;
  }
  if (!fs::exists(index_path, error)) {
    return absl::NotFoundError(absl::StrCat("no ", kSingleFile, " or ", kIndexFile, " in ", dir));
  }
  const std::string where = index_path.string();
  // Real indexes are tens of KB; a huge file is refused before it is read
  // whole, with the limit of a file's header.
  if (const uintmax_t size = fs::file_size(index_path, error); !error && size > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", size, " bytes exceeds the limit of ",
                                                   kMaxHeaderBytes));
  }
  std::ifstream in(index_path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Json index = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded() || !index.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": not a JSON object"));
  }
  auto weight_map = index.find("weight_map");
  if (weight_map == index.end() || !weight_map->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": \"weight_map\" missing or not an object"));
  }
  // shard file -> tensors the index puts there.
  std::map<std::string, std::set<std::string>> shards;
  for (auto it = weight_map->begin(); it != weight_map->end(); ++it) {
    if (!it->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": weight_map entry of tensor \"", it.key(), "\" is not a string"));
    }
    const std::string shard = it->get<std::string>();
    if (shard.empty() || absl::StrContains(shard, '/') || shard == "." || shard == "..") {
      return absl::InvalidArgumentError(absl::StrCat(where, ": tensor \"", it.key(),
                                                     "\" maps to \"", shard,
                                                     "\", not a file name in the directory"));
    }
    shards[shard].insert(it.key());
  }
  std::map<std::string, std::string> owner;  // tensor -> shard that holds it
  for (const auto& [shard, listed] : shards) {
    const fs::path shard_path = fs::path(dir) / shard;
    if (!fs::exists(shard_path, error)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": shard file ", shard,
                                                     " (of tensor \"", *listed.begin(),
                                                     "\") does not exist"));
    }
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
        SafetensorsFile::Open(shard_path.string());
    if (!file.ok()) return file.status();
    for (const TensorView& view : (*file)->tensors()) {
      auto [it, inserted] = owner.emplace(view.name, shard);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat("tensor \"", view.name, "\" is in two shards: ",
                                                       it->second, " and ", shard));
      }
      if (listed.count(view.name) == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor \"", view.name, "\" is in shard ", shard, " but ", where,
            " does not map it there"));
      }
      checkpoint->index_[view.name] = &view;
    }
    for (const std::string& name : listed) {
      if ((*file)->Find(name) == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, " maps tensor \"", name, "\" to shard ", shard, ", which does not hold it"));
      }
    }
    checkpoint->files_.push_back(*std::move(file));
  }
  return checkpoint;
}

const TensorView* SafetensorsCheckpoint::Find(absl::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> names;
  for (const auto& [name, view] : index_) names.push_back(name);
  return names;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  absl::StatusOr<std::vector<const TensorToWrite*>> sorted = SortedChecked(tensors);
  if (!sorted.ok()) return sorted.status();
  return WriteSorted(path, *sorted, metadata);
}

absl::StatusOr<std::vector<std::string>> WriteShardedSafetensors(
    const std::string& dir, const std::vector<TensorToWrite>& tensors, int64_t max_shard_bytes,
    const std::map<std::string, std::string>& metadata) {
  absl::StatusOr<std::vector<const TensorToWrite*>> sorted = SortedChecked(tensors);
  if (!sorted.ok()) return sorted.status();
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) {
    return absl::InternalError(absl::StrCat("cannot create directory ", dir, ": ", error.message()));
  }

  std::vector<std::vector<const TensorToWrite*>> shards(1);
  uint64_t shard_bytes = 0, total_bytes = 0;
  for (const TensorToWrite* tensor : *sorted) {
    const uint64_t size = tensor->data.size();
    if (max_shard_bytes > 0 && !shards.back().empty() &&
        shard_bytes + size > static_cast<uint64_t>(max_shard_bytes)) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(tensor);
    shard_bytes += size;
    total_bytes += size;
  }

  std::vector<std::string> written;
  if (shards.size() == 1) {
    written.push_back(kSingleFile);
  } else {
    for (size_t i = 0; i < shards.size(); ++i) {
      written.push_back(absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, shards.size()));
    }
  }
  for (size_t i = 0; i < shards.size(); ++i) {
    absl::Status status = WriteSorted((fs::path(dir) / written[i]).string(), shards[i], metadata);
    if (!status.ok()) return status;
  }
  if (shards.size() > 1) {
    Json weight_map = Json::object();
    for (size_t i = 0; i < shards.size(); ++i) {
      for (const TensorToWrite* tensor : shards[i]) weight_map[tensor->name] = written[i];
    }
    Json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
    const std::string path = (fs::path(dir) / kIndexFile).string();
    const std::string temp = absl::StrCat(path, ".tmp.", getpid());
    {
      std::ofstream out(temp, std::ios::trunc);
      out << index.dump(2) << "\n";
      if (!out.flush()) return absl::InternalError(absl::StrCat("cannot write ", temp));
    }
    if (std::rename(temp.c_str(), path.c_str()) != 0) {
      std::remove(temp.c_str());
      return absl::InternalError(absl::StrCat("cannot rename ", temp, " to ", path));
    }
    written.push_back(kIndexFile);
  }
  // Remove weight files of an earlier save that would shadow or confuse this one.
  const std::set<std::string> keep(written.begin(), written.end());
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    const bool weight_file =
        name == kSingleFile || name == kIndexFile ||
        (absl::StartsWith(name, "model-") && absl::StrContains(name, "-of-") &&
         absl::EndsWith(name, ".safetensors"));
    if (weight_file && keep.count(name) == 0) fs::remove(entry.path(), error);
  }
  return written;
}

}  // namespace sluice::model
