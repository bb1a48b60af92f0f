#ifndef SLUICE_BENCHMARKS_IPERF3_H_
#define SLUICE_BENCHMARKS_IPERF3_H_

// The loopback limit the network benchmarks measure themselves against, in
// the same run: iperf3 (installed by scripts/install-deps.sh) between a
// server and a client on 127.0.0.1.

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace sluice::bench {

// Loopback TCP bytes/s over `streams` parallel streams for `duration`: the
// aggregate received. FAILED_PRECONDITION when iperf3 cannot be run,
// INTERNAL when it gives no report.
absl::StatusOr<double> Iperf3BytesPerSecond(int streams = 1,
                                            absl::Duration duration = absl::Seconds(2));

}  // namespace sluice::bench

#endif  // SLUICE_BENCHMARKS_IPERF3_H_
