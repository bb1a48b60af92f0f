#ifndef SLUICE_COMMON_STATUS_MACROS_H_
#define SLUICE_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Plumbing for absl::Status, as in Reverb and LevelDB.
//
//   RETURN_IF_ERROR(file.Sync());
//   ASSIGN_OR_RETURN(Config config, LoadConfig(path));

#define SLUICE_STATUS_CONCAT_INNER_(a, b) a##b
#define SLUICE_STATUS_CONCAT_(a, b) SLUICE_STATUS_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                                   \
  do {                                                          \
    const ::absl::Status sluice_status_ = (expr);               \
    if (ABSL_PREDICT_FALSE(!sluice_status_.ok())) {             \
      return sluice_status_;                                    \
    }                                                           \
  } while (false)

#define ASSIGN_OR_RETURN(lhs, expr) \
  SLUICE_ASSIGN_OR_RETURN_IMPL_(    \
      SLUICE_STATUS_CONCAT_(sluice_statusor_, __LINE__), lhs, expr)

#define SLUICE_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                  \
  if (ABSL_PREDICT_FALSE(!statusor.ok())) {                \
    return std::move(statusor).status();                   \
  }                                                        \
  lhs = std::move(statusor).value()

#endif  // SLUICE_COMMON_STATUS_MACROS_H_
