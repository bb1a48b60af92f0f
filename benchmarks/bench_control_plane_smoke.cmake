# ctest BenchControlPlaneSmoke: runs `bench_control_plane` with 50 simulated
# workers for 3 s (cycle 500 ms, heartbeat 200 ms) against the real
# controller and replay buffer, and checks that it reports every worker RPC
# with calls and no errors, and that the run stayed TRAINING with every
# worker live. It asserts nothing about speed.
execute_process(COMMAND ${BENCH} --workers 50 --seconds 3 --cycle-ms 500
                        --heartbeat-interval-ms 200 --lanes 4 --json ${OUT}
                RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "bench_control_plane exited with ${status}")
endif()
file(READ ${OUT} report)
string(JSON workers GET "${report}" workers)
if(NOT workers EQUAL 50)
  message(FATAL_ERROR "bench_control_plane: workers is ${workers}, not 50")
endif()
foreach(rpc WorkerHeartbeat AcquireGenerationSlots LeasePrompts InsertGroups
            ReportRolloutProgress ControllerHealthCheck BufferHealthCheck)
  foreach(field calls per_s p50_ms p99_ms)
    string(JSON value ERROR_VARIABLE error GET "${report}" rpcs ${rpc} ${field})
    if(error OR NOT value GREATER 0)
      message(FATAL_ERROR "bench_control_plane: rpcs.${rpc}.${field} missing or not positive "
                          "(${value}) in ${report}")
    endif()
  endforeach()
  string(JSON errors GET "${report}" rpcs ${rpc} errors)
  if(NOT errors EQUAL 0)
    message(FATAL_ERROR "bench_control_plane: ${rpc} had ${errors} errors in ${report}")
  endif()
endforeach()
string(JSON state GET "${report}" run_state)
string(JSON live GET "${report}" workers_live)
if(NOT state STREQUAL "RUN_STATE_TRAINING" OR NOT live EQUAL 50)
  message(FATAL_ERROR "bench_control_plane: run ${state} with ${live} workers live")
endif()
message(STATUS "bench_control_plane smoke: ok")
