# ctest BenchAsyncVsSyncSmoke: runs `bench_async_vs_sync` on configs/smoke.yaml
# (a run of seconds) both ways and checks that every figure is reported, that
# both runs succeeded with their summaries on disk, and that the async run
# kept its staleness within eta. Nothing about speed.
execute_process(COMMAND ${BENCH} --spec ${SPEC} --eta 1 --seeds 3 --target-accuracy 0.01
                        --runs-dir ${RUNS} --json ${OUT}
                RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "bench_async_vs_sync exited with ${status}")
endif()
file(READ ${OUT} report)
foreach(key time_to_target_speedup target_accuracy final_accuracy_sync final_accuracy_async
            wall_seconds_sync wall_seconds_async)
  string(JSON value ERROR_VARIABLE error GET "${report}" ${key})
  if(error)
    message(FATAL_ERROR "bench_async_vs_sync: ${key} missing in ${report}")
  endif()
endforeach()
string(JSON runs LENGTH "${report}" runs)
if(NOT runs EQUAL 2)
  message(FATAL_ERROR "bench_async_vs_sync: ${runs} runs reported, expected 2")
endif()
foreach(i 0 1)
  string(JSON ok GET "${report}" runs ${i} succeeded)
  string(JSON summary GET "${report}" runs ${i} summary)
  string(JSON eta GET "${report}" runs ${i} eta)
  string(JSON staleness GET "${report}" runs ${i} staleness_mean)
  string(JSON decode GET "${report}" runs ${i} worker_decode_seconds)
  string(JSON idle GET "${report}" runs ${i} worker_idle_fraction)
  if(NOT ok OR NOT EXISTS "${summary}")
    message(FATAL_ERROR "bench_async_vs_sync: run ${i} did not succeed or has no ${summary}")
  endif()
  # The worker's account of its loop was found (it decoded something).
  if(NOT decode GREATER 0 OR idle LESS 0 OR idle GREATER 1)
    message(FATAL_ERROR "bench_async_vs_sync: run ${i}: worker decode ${decode} s, idle fraction ${idle}")
  endif()
  if(staleness GREATER eta)
    message(FATAL_ERROR "bench_async_vs_sync: run ${i} trained groups ${staleness} versions stale, eta ${eta}")
  endif()
endforeach()
message(STATUS "bench_async_vs_sync smoke: ok")
