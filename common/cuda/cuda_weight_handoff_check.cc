// cuda_weight_handoff_check: does the GPU hand-off of a weight version work on
// this machine, and what does it cost? A standalone program (no torch, no
// gRPC) for one machine with one NVIDIA GPU; prints one JSON object on stdout
// and exits non-zero if any check failed.
//
//   cuda_weight_handoff_check [--sizes-mb 988,3087] [--device 0] [--output FILE]
//
// For each payload size (decimal MB; 988 and 3087 are Qwen2.5-0.5B and -1.5B in
// bf16), with a deterministic pattern written by a kernel:
//  - the device CRC tree of the buffer (kernel time and GB/s);
//  - CUDA IPC: export a handle, start a child process (this binary, --child
//    ipc) that maps it, CRCs what it sees and copies it into a buffer of its
//    own (what a rollout worker does to take a version); the parent checks
//    both CRCs; export / open / copy / CRC times;
//  - host-staged, the least a host hand-off (the gRPC weight stream) costs:
//    D2H into pinned shared memory (memfd), the child registers it and copies
//    it H2D; CRC-checked the same way; the ratio IPC / host-staged;
//  - once (smallest size) the device digest against the host digest of the
//    same bytes copied to the host;
//  - NCCL (when built with it): a one-rank communicator broadcasting the
//    buffer into another, timed and CRC-checked. Two and more ranks await a
//    second GPU.
// Also the device's facts and its measured device-to-device bandwidth (a
// 1 GiB copy, 2 GiB allocated), the roofline for the copies above.
//
//   cuda_weight_handoff_check --self-test-host
// needs no GPU and calls no CUDA API: flag parsing, the host digest and the
// combine scheme of the kernel, on the host (a ctest case).
//
// Ran on one H200 (driver 580.159.04, CUDA 13.0, sm_90 build): all checks passed in ~6 s
// (binary built on the CPU-only machine, carried with its libraries).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/crc32c.h"
#include "common/cuda/crc32c_combine.h"
#include "common/cuda/cuda_status.h"
#include "common/cuda/device_crc_tree.h"
#include "common/cuda/device_info.h"
#include "common/cuda/device_pattern.h"
#include "common/cuda/ipc_buffer.h"
#include "common/cuda/weight_digest.h"
#include "common/status_macros.h"
#include "common/subprocess.h"
#include "nlohmann/json.hpp"
#if SLUICE_HAVE_NCCL
#include "common/cuda/nccl_broadcaster.h"
#endif

namespace sluice {
namespace {

using nlohmann::json;

constexpr uint64_t kBytesPerMb = 1000 * 1000;

struct Flags {
  std::vector<int64_t> sizes_mb = {988, 3087};
  int device = 0;
  int64_t bandwidth_mib = 1024;
  bool skip_nccl = false;
  std::string output_path;
  bool self_test_host = false;
  // Child mode (set by the parent).
  std::string child;  // "ipc" or "host"
  std::string handle_hex;
  std::string memfd_path;
  uint64_t bytes = 0;
};

double MsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

double GbPerS(uint64_t bytes, double ms) { return ms > 0 ? bytes / (ms * 1e-3) / 1e9 : 0; }

// RAII owners, so that every exit path frees what it took.
struct DeviceMemory {
  void* ptr = nullptr;
  DeviceMemory() = default;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() {
    if (ptr != nullptr) cudaFree(ptr);
  }
  absl::Status Allocate(uint64_t bytes, absl::string_view what) {
    return CudaStatus(cudaMalloc(&ptr, std::max<uint64_t>(bytes, 1)),
                      absl::StrCat("allocating ", bytes, " bytes of device memory for ", what));
  }
};

struct EventPair {
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  EventPair() = default;
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
  ~EventPair() {
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
  }
  absl::Status Create() {
    SLUICE_RETURN_IF_CUDA_ERROR(cudaEventCreate(&start), "creating a CUDA event");
    return CudaStatus(cudaEventCreate(&stop), "creating a CUDA event");
  }
  absl::Status Start(cudaStream_t stream) {
    return CudaStatus(cudaEventRecord(start, stream), "recording a CUDA event");
  }
  // Records the stop, waits for it and returns the milliseconds in between.
  absl::StatusOr<double> StopMs(cudaStream_t stream) {
    SLUICE_RETURN_IF_CUDA_ERROR(cudaEventRecord(stop, stream), "recording a CUDA event");
    SLUICE_RETURN_IF_CUDA_ERROR(cudaEventSynchronize(stop), "waiting for a CUDA event");
    float ms = 0;
    SLUICE_RETURN_IF_CUDA_ERROR(cudaEventElapsedTime(&ms, start, stop), "reading CUDA events");
    return static_cast<double>(ms);
  }
};

// Shared host memory (memfd) that both processes pin: the host-staged path.
struct SharedHostMemory {
  int fd = -1;
  void* data = nullptr;
  uint64_t bytes = 0;
  bool registered = false;
  SharedHostMemory() = default;
  SharedHostMemory(const SharedHostMemory&) = delete;
  SharedHostMemory& operator=(const SharedHostMemory&) = delete;
  ~SharedHostMemory() {
    if (registered) cudaHostUnregister(data);
    if (data != nullptr) munmap(data, std::max<uint64_t>(bytes, 1));
    if (fd >= 0) close(fd);
  }
  absl::Status Map(uint64_t size) {
    bytes = size;
    if (ftruncate(fd, static_cast<off_t>(std::max<uint64_t>(size, 1))) != 0) {
      return absl::InternalError(absl::StrCat("ftruncate of the staging memfd: ", strerror(errno)));
    }
    void* mapped =
        mmap(nullptr, std::max<uint64_t>(size, 1), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mapped == MAP_FAILED) {
      return absl::InternalError(absl::StrCat("mmap of the staging memfd: ", strerror(errno)));
    }
    data = mapped;
    return absl::OkStatus();
  }
  absl::Status Register() {
    SLUICE_RETURN_IF_CUDA_ERROR(
        cudaHostRegister(data, std::max<uint64_t>(bytes, 1), cudaHostRegisterDefault),
        "pinning the staging memory (cudaHostRegister)");
    registered = true;
    return absl::OkStatus();
  }
};

std::string SelfPath() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return "";
  return std::string(path, static_cast<size_t>(n));
}

// ---------------------------------------------------------------------------
// The child: one hand-off as a rollout worker would take it.

absl::StatusOr<json> RunChildIpc(const Flags& flags) {
  json report;
  auto start = std::chrono::steady_clock::now();
  SLUICE_RETURN_IF_CUDA_ERROR(cudaSetDevice(flags.device), "child: cudaSetDevice");
  SLUICE_RETURN_IF_CUDA_ERROR(cudaFree(nullptr), "child: creating the CUDA context");
  report["context_ms"] = MsSince(start);
  const bool is_hex = flags.handle_hex.size() % 2 == 0 &&
                      std::all_of(flags.handle_hex.begin(), flags.handle_hex.end(),
                                  [](unsigned char c) { return std::isxdigit(c) != 0; });
  if (!is_hex) return absl::InvalidArgumentError("child: --handle-hex is not hex");
  const std::string handle = absl::HexStringToBytes(flags.handle_hex);
  start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(ImportedIpcBuffer imported, ImportedIpcBuffer::Open(handle));
  report["open_ms"] = MsSince(start);
  if (imported.size() != flags.bytes) {
    return absl::InternalError(absl::StrCat("child: the handle says ", imported.size(),
                                            " bytes, the parent ", flags.bytes));
  }
  cudaStream_t stream = nullptr;  // The legacy default stream: simplest ordering.
  start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(uint32_t mapped_digest, DeviceCrcTree(imported.data(), imported.size(), stream));
  report["crc_of_mapping_ms"] = MsSince(start);
  report["crc_of_mapping"] = FormatCrcTree32c(mapped_digest);

  DeviceMemory own;
  RETURN_IF_ERROR(own.Allocate(flags.bytes, "the child's copy"));
  EventPair events;
  RETURN_IF_ERROR(events.Create());
  start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(events.Start(stream));
  SLUICE_RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(own.ptr, imported.data(), flags.bytes, cudaMemcpyDeviceToDevice, stream),
      "child: copying the mapped buffer into its own");
  ASSIGN_OR_RETURN(double copy_ms, events.StopMs(stream));
  report["copy_ms"] = copy_ms;
  report["copy_wall_ms"] = MsSince(start);
  ASSIGN_OR_RETURN(uint32_t copy_digest, DeviceCrcTree(own.ptr, flags.bytes, stream));
  report["crc_of_copy"] = FormatCrcTree32c(copy_digest);
  start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(imported.Close());
  report["close_ms"] = MsSince(start);
  return report;
}

absl::StatusOr<json> RunChildHost(const Flags& flags) {
  json report;
  auto start = std::chrono::steady_clock::now();
  SLUICE_RETURN_IF_CUDA_ERROR(cudaSetDevice(flags.device), "child: cudaSetDevice");
  SLUICE_RETURN_IF_CUDA_ERROR(cudaFree(nullptr), "child: creating the CUDA context");
  report["context_ms"] = MsSince(start);
  SharedHostMemory staging;
  staging.fd = open(flags.memfd_path.c_str(), O_RDWR | O_CLOEXEC);
  if (staging.fd < 0) {
    return absl::InternalError(
        absl::StrCat("child: opening ", flags.memfd_path, ": ", strerror(errno)));
  }
  RETURN_IF_ERROR(staging.Map(flags.bytes));
  start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(staging.Register());
  report["register_ms"] = MsSince(start);
  DeviceMemory own;
  RETURN_IF_ERROR(own.Allocate(flags.bytes, "the child's copy"));
  EventPair events;
  RETURN_IF_ERROR(events.Create());
  cudaStream_t stream = nullptr;
  RETURN_IF_ERROR(events.Start(stream));
  SLUICE_RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(own.ptr, staging.data, flags.bytes, cudaMemcpyHostToDevice, stream),
      "child: copying the staged bytes to the device");
  ASSIGN_OR_RETURN(double h2d_ms, events.StopMs(stream));
  report["h2d_ms"] = h2d_ms;
  ASSIGN_OR_RETURN(uint32_t copy_digest, DeviceCrcTree(own.ptr, flags.bytes, stream));
  report["crc_of_copy"] = FormatCrcTree32c(copy_digest);
  return report;
}

int ChildMain(const Flags& flags) {
  absl::StatusOr<json> report = flags.child == "ipc" ? RunChildIpc(flags)
                                : flags.child == "host"
                                    ? RunChildHost(flags)
                                    : absl::InvalidArgumentError("--child must be ipc or host");
  const json line = report.ok() ? *report : json{{"error", report.status().ToString()}};
  const absl::Status reported = ReportReady(Subprocess::kReadyFd, line.dump());
  if (!reported.ok()) std::fprintf(stderr, "child: %s\n", reported.ToString().c_str());
  return report.ok() && reported.ok() ? 0 : 1;
}

// Starts this binary as a child with `args` and returns the JSON line it
// reports (an error if it reports one or fails).
absl::StatusOr<json> RunChild(const std::vector<std::string>& args) {
  SubprocessOptions options;
  options.argv = {SelfPath()};
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  options.ready_pipe = true;
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(std::unique_ptr<Subprocess> child, Subprocess::Start(options));
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  absl::StatusOr<std::string> line = child->WaitReady(deadline);
  absl::StatusOr<ExitStatus> exit = child->Wait(deadline);
  if (!line.ok()) return line.status();
  json report = json::parse(*line, nullptr, /*allow_exceptions=*/false);
  if (report.is_discarded() || !report.is_object()) {
    return absl::InternalError(absl::StrCat("child reported something other than JSON: ", *line));
  }
  if (report.contains("error")) {
    return absl::InternalError(absl::StrCat("child: ", report["error"].get<std::string>()));
  }
  if (!exit.ok()) return exit.status();
  if (!exit->success()) return absl::InternalError(absl::StrCat("child ", exit->ToString()));
  report["process_wall_ms"] = MsSince(start);
  return report;
}

// ---------------------------------------------------------------------------
// The parent.

struct Outcome {
  json report = json::object();
  std::vector<std::string> failures;
  void Fail(absl::string_view check, const absl::Status& status) {
    failures.push_back(absl::StrCat(check, ": ", status.ToString()));
  }
  void FailIf(bool failed, absl::string_view check, absl::string_view detail) {
    if (failed) failures.push_back(absl::StrCat(check, ": ", detail));
  }
};

absl::StatusOr<json> CheckIpc(const Flags& flags, const void* buffer, uint64_t bytes,
                              const std::string& digest, Outcome& outcome) {
  json ipc;
  auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(std::string handle, ExportIpcHandle(buffer, bytes));
  ipc["export_ms"] = MsSince(start);
  ipc["handle_bytes"] = handle.size();
  ASSIGN_OR_RETURN(json child, RunChild({"--child", "ipc", "--device", std::to_string(flags.device),
                                         "--bytes", std::to_string(bytes), "--handle-hex",
                                         absl::BytesToHexString(handle)}));
  ipc["child"] = child;
  const double open_ms = child["open_ms"].get<double>();
  const double copy_ms = child["copy_ms"].get<double>();
  ipc["open_ms"] = open_ms;
  ipc["copy_ms"] = copy_ms;
  ipc["copy_payload_gb_per_s"] = GbPerS(bytes, copy_ms);
  ipc["handoff_ms"] = open_ms + copy_ms;  // What a worker waits, context already up.
  const bool mapping_ok = child["crc_of_mapping"] == digest;
  const bool copy_ok = child["crc_of_copy"] == digest;
  ipc["crc_of_mapping_matches"] = mapping_ok;
  ipc["crc_of_copy_matches"] = copy_ok;
  outcome.FailIf(!mapping_ok, "ipc", "the child's CRC of the mapped buffer differs");
  outcome.FailIf(!copy_ok, "ipc", "the child's CRC of its copy differs");
  return ipc;
}

absl::StatusOr<json> CheckHostStaged(const Flags& flags, const void* buffer, uint64_t bytes,
                                     const std::string& digest, bool check_host_digest,
                                     Outcome& outcome) {
  json staged;
  SharedHostMemory staging;
  staging.fd = memfd_create("sluice-handoff-staging", MFD_CLOEXEC);
  if (staging.fd < 0) return absl::InternalError(absl::StrCat("memfd_create: ", strerror(errno)));
  RETURN_IF_ERROR(staging.Map(bytes));
  auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(staging.Register());
  staged["register_ms"] = MsSince(start);
  EventPair events;
  RETURN_IF_ERROR(events.Create());
  RETURN_IF_ERROR(events.Start(nullptr));
  SLUICE_RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(staging.data, buffer, bytes, cudaMemcpyDeviceToHost, nullptr),
      "copying the buffer to pinned host memory");
  ASSIGN_OR_RETURN(double d2h_ms, events.StopMs(nullptr));
  staged["d2h_ms"] = d2h_ms;
  staged["d2h_gb_per_s"] = GbPerS(bytes, d2h_ms);
  ASSIGN_OR_RETURN(json child,
                   RunChild({"--child", "host", "--device", std::to_string(flags.device), "--bytes",
                             std::to_string(bytes), "--memfd-path",
                             absl::StrCat("/proc/", getpid(), "/fd/", staging.fd)}));
  staged["child"] = child;
  const double h2d_ms = child["h2d_ms"].get<double>();
  staged["h2d_ms"] = h2d_ms;
  staged["h2d_gb_per_s"] = GbPerS(bytes, h2d_ms);
  staged["handoff_ms"] = d2h_ms + h2d_ms;
  const bool copy_ok = child["crc_of_copy"] == digest;
  staged["crc_of_copy_matches"] = copy_ok;
  outcome.FailIf(!copy_ok, "host_staged", "the child's CRC of its copy differs");
  if (check_host_digest) {
    // The same bytes, on the host: the device CRC tree must equal the host's.
    start = std::chrono::steady_clock::now();
    const uint32_t host = CrcTree32c(
        absl::string_view(static_cast<const char*>(staging.data), static_cast<size_t>(bytes)));
    json check = {{"host_digest", FormatCrcTree32c(host)},
                  {"host_crc_ms", MsSince(start)},
                  {"matches_device", FormatCrcTree32c(host) == digest}};
    outcome.FailIf(FormatCrcTree32c(host) != digest, "host_digest",
                   "the host digest of the copied bytes differs from the device digest");
    outcome.report["host_digest_check"] = check;
    outcome.report["host_digest_check"]["bytes"] = bytes;
  }
  return staged;
}

#if SLUICE_HAVE_NCCL
absl::StatusOr<json> CheckNccl(NcclBroadcaster& nccl, const void* buffer, uint64_t bytes,
                               const std::string& digest, Outcome& outcome) {
  json report;
  DeviceMemory destination;
  RETURN_IF_ERROR(destination.Allocate(bytes, "the NCCL destination"));
  SLUICE_RETURN_IF_CUDA_ERROR(cudaMemset(destination.ptr, 0, bytes), "clearing the destination");
  cudaStream_t stream = nullptr;
  SLUICE_RETURN_IF_CUDA_ERROR(cudaStreamCreate(&stream), "creating a stream for NCCL");
  EventPair events;
  absl::Status status = events.Create();
  const DeviceBuffer source{const_cast<void*>(buffer), bytes};
  const DeviceBuffer target{destination.ptr, bytes};
  double out_of_place_ms = 0;
  double in_place_ms = 0;
  if (status.ok()) status = events.Start(stream);
  if (status.ok()) status = nccl.BroadcastOutOfPlace({&source, 1}, {&target, 1}, 0, stream);
  if (status.ok()) {
    absl::StatusOr<double> ms = events.StopMs(stream);
    status = ms.status();
    if (ms.ok()) out_of_place_ms = *ms;
  }
  if (status.ok()) status = events.Start(stream);
  if (status.ok()) status = nccl.Broadcast({&target, 1}, 0, stream);
  if (status.ok()) {
    absl::StatusOr<double> ms = events.StopMs(stream);
    status = ms.status();
    if (ms.ok()) in_place_ms = *ms;
  }
  absl::StatusOr<uint32_t> received = status.ok() ? DeviceCrcTree(destination.ptr, bytes, stream)
                                                  : absl::StatusOr<uint32_t>(status);
  cudaStreamDestroy(stream);
  if (!received.ok()) return received.status();
  report["out_of_place_ms"] = out_of_place_ms;
  report["out_of_place_payload_gb_per_s"] = GbPerS(bytes, out_of_place_ms);
  report["in_place_ms"] = in_place_ms;
  report["crc_of_destination_matches"] = FormatCrcTree32c(*received) == digest;
  outcome.FailIf(FormatCrcTree32c(*received) != digest, "nccl",
                 "the CRC of the broadcast destination differs");
  return report;
}
#endif

json CheckOneSize(const Flags& flags, int64_t size_mb, bool first, void* nccl_or_null,
                  const json& d2d, Outcome& outcome) {
  const uint64_t bytes = static_cast<uint64_t>(size_mb) * kBytesPerMb;
  json report = {{"size_mb", size_mb}, {"bytes", bytes}};
  const std::string where = absl::StrCat("size ", size_mb, " MB");
  DeviceMemory buffer;
  absl::Status status = buffer.Allocate(bytes, "the payload");
  if (!status.ok()) {
    outcome.Fail(where, status);
    return report;
  }
  EventPair events;
  status = events.Create();
  if (status.ok()) status = events.Start(nullptr);
  if (status.ok()) status = EnqueueFillPattern(buffer.ptr, bytes, 0x51u + size_mb, nullptr);
  absl::StatusOr<double> fill_ms = status.ok() ? events.StopMs(nullptr) : status;
  if (!fill_ms.ok()) {
    outcome.Fail(absl::StrCat(where, ": fill"), fill_ms.status());
    return report;
  }
  report["fill_ms"] = *fill_ms;

  // The digest (its first call also loads the kernel), then the kernel alone.
  auto start = std::chrono::steady_clock::now();
  absl::StatusOr<uint32_t> digest_value = DeviceCrcTree(buffer.ptr, bytes, nullptr);
  if (!digest_value.ok()) {
    outcome.Fail(absl::StrCat(where, ": device CRC tree"), digest_value.status());
    return report;
  }
  const double first_call_ms = MsSince(start);
  const std::string digest = FormatCrcTree32c(*digest_value);
  report["digest"] = digest;
  {
    DeviceMemory scratch;
    double best_ms = 0;
    status = scratch.Allocate(CrcTreeChunkCount(bytes) * 4, "chunk CRCs");
    for (int i = 0; i < 3 && status.ok(); ++i) {
      status = events.Start(nullptr);
      if (status.ok()) {
        status =
            EnqueueDeviceChunkCrcs(buffer.ptr, bytes, static_cast<uint32_t*>(scratch.ptr), nullptr);
      }
      absl::StatusOr<double> ms = status.ok() ? events.StopMs(nullptr) : status;
      status = ms.status();
      if (ms.ok()) best_ms = i == 0 ? *ms : std::min(best_ms, *ms);
    }
    start = std::chrono::steady_clock::now();
    absl::StatusOr<uint32_t> again =
        status.ok() ? DeviceCrcTree(buffer.ptr, bytes, nullptr) : absl::StatusOr<uint32_t>(status);
    if (!again.ok()) {
      outcome.Fail(absl::StrCat(where, ": device CRC tree"), again.status());
      return report;
    }
    outcome.FailIf(*again != *digest_value, where, "the device CRC tree is not deterministic");
    report["device_crc"] = {
        {"kernel_ms", best_ms},
        {"kernel_gb_per_s", GbPerS(bytes, best_ms)},
        {"call_ms", MsSince(start)},  // Kernel + scratch + chunk CRCs to the host + finish.
        {"first_call_ms", first_call_ms},
        {"fraction_of_d2d_read_bandwidth",
         d2d.contains("best_gb_per_s") && d2d["best_gb_per_s"].get<double>() > 0
             ? GbPerS(bytes, best_ms) / (d2d["best_gb_per_s"].get<double>() / 2)
             : 0.0}};
  }

  absl::StatusOr<json> ipc = CheckIpc(flags, buffer.ptr, bytes, digest, outcome);
  if (ipc.ok()) {
    report["ipc"] = *ipc;
  } else {
    outcome.Fail(absl::StrCat(where, ": ipc"), ipc.status());
  }
  absl::StatusOr<json> staged = CheckHostStaged(flags, buffer.ptr, bytes, digest, first, outcome);
  if (staged.ok()) {
    report["host_staged"] = *staged;
  } else {
    outcome.Fail(absl::StrCat(where, ": host_staged"), staged.status());
  }
  if (ipc.ok() && staged.ok()) {
    report["ipc_over_host_staged"] =
        (*ipc)["handoff_ms"].get<double>() / (*staged)["handoff_ms"].get<double>();
  }
#if SLUICE_HAVE_NCCL
  if (nccl_or_null != nullptr) {
    absl::StatusOr<json> nccl =
        CheckNccl(*static_cast<NcclBroadcaster*>(nccl_or_null), buffer.ptr, bytes, digest, outcome);
    if (nccl.ok()) {
      report["nccl"] = *nccl;
    } else {
      outcome.Fail(absl::StrCat(where, ": nccl"), nccl.status());
    }
  }
#endif
  return report;
}

int ParentMain(const Flags& flags) {
  const auto started = std::chrono::steady_clock::now();
  Outcome outcome;
  json& report = outcome.report;
  report["program"] = "cuda_weight_handoff_check";
  report["sizes_mb"] = flags.sizes_mb;
  absl::Status status = CudaStatus(cudaSetDevice(flags.device), "cudaSetDevice");
  absl::StatusOr<CudaDeviceInfo> info =
      status.ok() ? GetCudaDeviceInfo(flags.device) : absl::StatusOr<CudaDeviceInfo>(status);
  if (info.ok()) {
    report["device"] = {
        {"ordinal", info->device},
        {"name", info->name},
        {"uuid", info->uuid},
        {"pci_bus_id", info->pci_bus_id},
        {"compute_capability",
         absl::StrCat(info->compute_capability_major, ".", info->compute_capability_minor)},
        {"multiprocessors", info->multiprocessor_count},
        {"total_memory_bytes", info->total_memory_bytes},
        {"free_memory_bytes", info->free_memory_bytes},
        {"theoretical_memory_gb_per_s", info->theoretical_memory_bandwidth_gb_per_s},
        {"driver_version", info->driver_version},
        {"runtime_version", info->runtime_version}};
    absl::StatusOr<DeviceBandwidth> bandwidth =
        MeasureDeviceBandwidth(static_cast<size_t>(flags.bandwidth_mib) << 20);
    if (bandwidth.ok()) {
      report["device_to_device"] = {{"copy_bytes", bandwidth->copy_bytes},
                                    {"repetitions", bandwidth->repetitions},
                                    {"best_ms", bandwidth->best_ms},
                                    {"mean_ms", bandwidth->mean_ms},
                                    {"best_gb_per_s", bandwidth->best_gb_per_s},
                                    {"counts", "bytes read + bytes written"}};
    } else {
      outcome.Fail("device_to_device", bandwidth.status());
    }
  } else {
    outcome.Fail("device", info.status());
  }

  void* nccl_or_null = nullptr;
#if SLUICE_HAVE_NCCL
  std::unique_ptr<NcclBroadcaster> nccl;
  json nccl_report = {{"built", true},
                      {"nranks", 1},
                      {"note", "one GPU: a 1-rank communicator; 2+ ranks await a second GPU"}};
  if (info.ok() && !flags.skip_nccl) {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<std::string> id = NcclBroadcaster::NewUniqueId();
    absl::StatusOr<std::unique_ptr<NcclBroadcaster>> created =
        id.ok() ? NcclBroadcaster::Create(*id, 0, 1, flags.device)
                : absl::StatusOr<std::unique_ptr<NcclBroadcaster>>(id.status());
    if (created.ok()) {
      nccl = std::move(*created);
      nccl_or_null = nccl.get();
      nccl_report["init_ms"] = MsSince(start);
    } else {
      outcome.Fail("nccl init", created.status());
    }
  }
  nccl_report["skipped"] = flags.skip_nccl;
  report["nccl"] = nccl_report;
#else
  report["nccl"] = {{"built", false}, {"note", "built without NCCL"}};
#endif

  if (info.ok()) {
    std::vector<int64_t> sizes = flags.sizes_mb;
    json sizes_report = json::array();
    const int64_t smallest = *std::min_element(sizes.begin(), sizes.end());
    bool host_digest_checked = false;
    for (int64_t size_mb : sizes) {
      const bool check_host = !host_digest_checked && size_mb == smallest;
      host_digest_checked = host_digest_checked || check_host;
      sizes_report.push_back(CheckOneSize(flags, size_mb, check_host, nccl_or_null,
                                          report.value("device_to_device", json::object()),
                                          outcome));
    }
    report["sizes"] = sizes_report;
  }
#if SLUICE_HAVE_NCCL
  nccl.reset();
#endif
  report["wall_s"] = MsSince(started) / 1e3;
  report["failures"] = outcome.failures;
  report["ok"] = outcome.failures.empty();
  const std::string text = report.dump(2);
  std::cout << text << std::endl;
  if (!flags.output_path.empty()) std::ofstream(flags.output_path) << text << "\n";
  return outcome.failures.empty() ? 0 : 1;
}

// No CUDA call on this path: it runs where there is no driver.
int SelfTestHostMain(const Flags& flags) {
  json report = {{"program", "cuda_weight_handoff_check"}, {"mode", "self-test-host"}};
  std::vector<std::string> failures;
  // The kernel's scheme on the host: 4 KiB piece CRCs folded with the combine
  // math equal each 1 MiB chunk's CRC, and the digest is the host digest.
  std::string bytes(3 * kCrcTreeChunkBytes + 12345, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(PatternByte(0x51, i));
  std::vector<uint32_t> chunk_crcs;
  const absl::string_view view = bytes;
  for (size_t offset = 0; offset < view.size(); offset += kCrcTreeChunkBytes) {
    const absl::string_view chunk = view.substr(offset, kCrcTreeChunkBytes);
    uint32_t crc = 0;
    for (size_t piece = 0; piece < chunk.size(); piece += 4096) {
      const absl::string_view part = chunk.substr(piece, 4096);
      crc = crc32c_math::Combine(crc, Crc32c(part), part.size());
    }
    if (crc != Crc32c(chunk)) failures.push_back(absl::StrCat("chunk at ", offset));
    chunk_crcs.push_back(crc);
  }
  const uint32_t digest = CrcTree32c(view);
  if (CrcTree32cFromChunkCrcs(chunk_crcs) != digest) failures.push_back("digest of chunk CRCs");
  report["bytes"] = bytes.size();
  report["digest"] = FormatCrcTree32c(digest);
  report["sizes_mb"] = flags.sizes_mb;
  report["failures"] = failures;
  report["ok"] = failures.empty();
  std::cout << report.dump(2) << std::endl;
  return failures.empty() ? 0 : 1;
}

}  // namespace
}  // namespace sluice

int main(int argc, char** argv) {
  sluice::Flags flags;
  CLI::App app{
      "cuda_weight_handoff_check: CUDA IPC, NCCL and the device CRC tree on one GPU, "
      "against a host-staged hand-off; one JSON object on stdout"};
  app.add_option("--sizes-mb", flags.sizes_mb, "payload sizes in decimal MB, comma-separated")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--device", flags.device, "CUDA device ordinal")->capture_default_str();
  app.add_option("--bandwidth-mib", flags.bandwidth_mib,
                 "bytes of the device-to-device bandwidth copy, in MiB (twice that allocated)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--skip-nccl", flags.skip_nccl, "leave NCCL out");
  app.add_option("--output", flags.output_path, "also write the JSON to this file");
  app.add_flag("--self-test-host", flags.self_test_host,
               "host-only self test: no GPU, no CUDA call");
  app.add_option("--child", flags.child, "internal: run as the child of a hand-off (ipc, host)")
      ->group("");
  app.add_option("--handle-hex", flags.handle_hex, "internal")->group("");
  app.add_option("--memfd-path", flags.memfd_path, "internal")->group("");
  app.add_option("--bytes", flags.bytes, "internal")->group("");
  CLI11_PARSE(app, argc, argv);
  if (flags.sizes_mb.empty()) {
    std::cerr << "--sizes-mb needs at least one size\n";
    return 2;
  }
  if (flags.self_test_host) return sluice::SelfTestHostMain(flags);
  if (!flags.child.empty()) return sluice::ChildMain(flags);
  return sluice::ParentMain(flags);
}
