# ctest BenchModelSmoke: runs `bench_model --quick --json OUT` and checks that
# every figure is reported and that our forward and Python PyTorch's compute
# the same function (logits of one position within 1e-3). Nothing about speed.
execute_process(COMMAND ${BENCH} --quick --json ${OUT} RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "bench_model exited with ${status}")
endif()
file(READ ${OUT} report)
foreach(path "tokenizer;qwen2;encode_mb_per_s" "tokenizer;llama3;encode_mb_per_s"
             "tokenizer;qwen2;decode_mb_per_s" "model;forward_tokens_per_s"
             "model;decode_tokens_per_s" "model;python_torch;forward_tokens_per_s"
             "model;forward_ratio_vs_python" "model;decode_ratio_vs_python"
             "model;load_seconds" "model;load_speedup_vs_python")
  string(JSON value ERROR_VARIABLE error GET "${report}" ${path})
  if(error OR NOT value GREATER 0)
    message(FATAL_ERROR "bench_model: ${path} missing or not positive (${value}) in ${report}")
  endif()
endforeach()
string(JSON diff GET "${report}" model max_abs_logit_diff_vs_python)
if(diff GREATER 0.001)
  message(FATAL_ERROR "bench_model: logits differ from Python PyTorch's by ${diff}")
endif()
message(STATUS "bench_model smoke: ok")
