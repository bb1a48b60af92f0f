# ctest BenchWeightFanoutSmoke: runs `bench_weight_fanout --quick --json OUT`
# and checks what it reports: every worker got each version, and through the
# relay tree the trainer sent each version once (root fanout 1), where
# streaming to every worker sends it once per worker. Nothing about speed.
execute_process(COMMAND ${BENCH} --quick --json ${OUT} RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "bench_weight_fanout exited with ${status}")
endif()
file(READ ${OUT} report)
string(JSON iperf GET "${report}" iperf3_bytes_per_s)
if(NOT iperf GREATER 0)
  message(FATAL_ERROR "bench_weight_fanout: no iperf3 figure in ${report}")
endif()
string(JSON n_runs LENGTH "${report}" runs)
math(EXPR last "${n_runs} - 1")
foreach(i RANGE ${last})
  string(JSON workers GET "${report}" runs ${i} workers)
  string(JSON relayed GET "${report}" runs ${i} trainer_egress_versions_per_version)
  string(JSON star GET "${report}" baseline_runs ${i} trainer_egress_versions_per_version)
  string(JSON seconds GET "${report}" runs ${i} seconds_to_all_workers)
  if(NOT seconds GREATER 0)
    message(FATAL_ERROR "bench_weight_fanout: no time for ${workers} workers")
  endif()
  if(NOT relayed EQUAL 1)
    message(FATAL_ERROR "bench_weight_fanout: the trainer sent ${relayed} versions per version "
                        "to ${workers} relaying workers (expected 1)")
  endif()
  if(NOT star EQUAL workers)
    message(FATAL_ERROR "bench_weight_fanout: star baseline sent ${star} versions per version "
                        "to ${workers} workers")
  endif()
endforeach()
message(STATUS "bench_weight_fanout smoke: ok")
