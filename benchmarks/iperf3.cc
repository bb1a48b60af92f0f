#include "benchmarks/iperf3.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/subprocess.h"
#include "nlohmann/json.hpp"

namespace sluice::bench {

using nlohmann::json;

absl::StatusOr<double> Iperf3BytesPerSecond(int streams, absl::Duration duration) {
  const int port = 15201 + static_cast<int>(getpid() % 1000);
  SubprocessOptions server;
  server.argv = {"/usr/bin/iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", std::to_string(port)};
  server.log_path = "/dev/null";
  auto child = Subprocess::Start(server);
  if (!child.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot run iperf3 (scripts/install-deps.sh installs it): ", child.status().message()));
  }
  absl::SleepFor(absl::Milliseconds(300));
  const std::string command = absl::StrCat("/usr/bin/iperf3 -c 127.0.0.1 -p ", port, " -t ",
                                           std::max<int64_t>(1, absl::ToInt64Seconds(duration)),
                                           " -P ", streams, " -J 2>/dev/null");
  std::string out;
  if (FILE* pipe = popen(command.c_str(), "r")) {
    char buffer[4096];
    size_t n;
    while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
    pclose(pipe);
  }
  (*child)->Stop(absl::Seconds(1));
  json report = json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (report.is_discarded() || !report.contains("end")) {
    return absl::InternalError(absl::StrCat("iperf3 gave no report: ", out.substr(0, 200)));
  }
  return report["end"]["sum_received"]["bits_per_second"].get<double>() / 8;
}

}  // namespace sluice::bench
