# ctest BenchRewardSmoke: runs `bench_reward --quick --json OUT` and checks
# that it reports every figure (positive rates, every canonical HumanEval
# solution passing in the sandbox). It asserts nothing about speed.
execute_process(COMMAND ${BENCH} --quick --json ${OUT} RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "bench_reward exited with ${status}")
endif()
file(READ ${OUT} report)
foreach(path "math;verifications_per_s" "math;verifications_per_s_2_threads"
             "math;ratio_vs_sympy" "math;sympy;verifications_per_s" "math;agreement"
             "code;executions_per_s" "code;concurrency_1;bare_python_executions_per_s"
             "code;concurrency_1;ratio_vs_bare_python" "code;ratio_vs_bare_python"
             "code;concurrency_2;ratio_vs_per_run_sandbox"
             "code;per_run_sandbox;concurrency_1;executions_per_s" "code;pool;slots_started")
  string(JSON value ERROR_VARIABLE error GET "${report}" ${path})
  if(error OR NOT value GREATER 0)
    message(FATAL_ERROR "bench_reward: ${path} missing or not positive (${value}) in ${report}")
  endif()
endforeach()
string(JSON programs GET "${report}" code programs)
foreach(concurrency 1 2)
  string(JSON passed GET "${report}" code concurrency_${concurrency} passed)
  string(JSON passed_per_run GET "${report}" code per_run_sandbox concurrency_${concurrency} passed)
  if(NOT passed EQUAL programs OR NOT passed_per_run EQUAL programs)
    message(FATAL_ERROR "bench_reward: ${passed}/${programs} canonical solutions passed at "
                        "concurrency ${concurrency}")
  endif()
endforeach()
message(STATUS "bench_reward smoke: ok")
