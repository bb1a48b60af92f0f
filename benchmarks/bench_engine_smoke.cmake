# ctest BenchEngineSmoke: runs `bench_engine --quick --json OUT` and checks that
# every figure is reported, that all sides did the same work (the same useful
# tokens: the workload's lengths), that the static batch decoded the rows
# Python's did, and that the continuous-batching engine decoded no row it
# threw away. Nothing about speed.
execute_process(COMMAND ${BENCH} --quick --json ${OUT} RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "bench_engine exited with ${status}")
endif()
file(READ ${OUT} report)
foreach(path "engine;tokens_per_s" "engine;useful_tokens" "engine;decoded_row_steps"
             "engine;prompt_prefills" "static_batch;tokens_per_s" "static_batch;useful_tokens"
             "static_batch;decoded_row_steps" "continuous_vs_static" "python_torch;tokens_per_s" "python_torch;useful_tokens" "engine_vs_python"
             "workload;sequences" "workload;length_max")
  string(JSON value ERROR_VARIABLE error GET "${report}" ${path})
  if(error OR NOT value GREATER 0)
    message(FATAL_ERROR "bench_engine: ${path} missing or not positive (${value}) in ${report}")
  endif()
endforeach()
string(JSON ours GET "${report}" engine useful_tokens)
string(JSON theirs GET "${report}" python_torch useful_tokens)
string(JSON static_useful GET "${report}" static_batch useful_tokens)
string(JSON steps GET "${report}" static_batch decoded_row_steps)
string(JSON their_steps GET "${report}" python_torch decoded_row_steps)
if(NOT ours EQUAL theirs OR NOT static_useful EQUAL theirs OR NOT steps EQUAL their_steps)
  message(FATAL_ERROR "bench_engine: the sides did different work: useful ${ours} (engine), "
                      "${static_useful} (static) vs ${theirs}, row-steps ${steps} vs ${their_steps}")
endif()
string(JSON engine_steps GET "${report}" engine decoded_row_steps)
string(JSON prefills GET "${report}" engine prompt_prefills)
string(JSON prompts GET "${report}" workload prompts)
if(NOT engine_steps EQUAL ours OR NOT prefills EQUAL prompts)
  message(FATAL_ERROR "bench_engine: the engine decoded ${engine_steps} row-steps for ${ours} "
                      "tokens and ${prefills} prefills for ${prompts} prompts")
endif()
message(STATUS "bench_engine smoke: ok")
