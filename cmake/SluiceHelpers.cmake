# sluice_test(NAME SOURCES... DEPS ... [LABELS ...] [TIMEOUT seconds])
# One gtest binary per component test file; each TEST becomes a ctest case.
function(sluice_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gmock GTest::gtest_main)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  # Third-party test data kept in the repo (testdata/README.md).
  target_compile_definitions(${name} PRIVATE SLUICE_TESTDATA_DIR="${PROJECT_SOURCE_DIR}/testdata")
  set(labels unit)
  if(ARG_LABELS)
    set(labels ${ARG_LABELS})
  endif()
  gtest_discover_tests(${name}
    DISCOVERY_TIMEOUT 60
    PROPERTIES LABELS "${labels}" TIMEOUT ${ARG_TIMEOUT}
               ENVIRONMENT "SLUICE_BIN_DIR=${CMAKE_BINARY_DIR}/bin;SLUICE_TESTDATA_DIR=${PROJECT_SOURCE_DIR}/testdata")
endfunction()

# sluice_fuzz_target(NAME SOURCES... DEPS... CORPUS dir [REPLAY_ARGS ...])
# A libFuzzer target (its LLVMFuzzerTestOneInput in SOURCES), built two ways:
#  - NAME_fuzz_replay (any compiler, always): common/fuzz/replay_main.cc runs
#    the target over CORPUS (and REPLAY_ARGS); ctest's <Name>FuzzReplay, so
#    every ./test.sh replays the corpus and the crash reproducers kept in it.
#  - NAME_fuzz (clang with -DSLUICE_FUZZ=ON; scripts/fuzz.sh): the libFuzzer
#    binary, with AddressSanitizer and UndefinedBehaviorSanitizer.
# scripts/fuzz.sh finds the corpus of NAME in CORPUS's place: keep them
# together as <component>/fuzz/corpus/NAME.
function(sluice_fuzz_target name)
  cmake_parse_arguments(ARG "" "CORPUS" "SOURCES;DEPS;REPLAY_ARGS" ${ARGN})
  add_executable(${name}_fuzz_replay ${PROJECT_SOURCE_DIR}/common/fuzz/replay_main.cc
                                     ${ARG_SOURCES})
  target_link_libraries(${name}_fuzz_replay PRIVATE ${ARG_DEPS} nlohmann_json::nlohmann_json)
  if(SLUICE_BUILD_TESTS)
    # run_spec -> RunSpecFuzzReplay
    string(REPLACE "_" ";" parts ${name})
    set(test_name "")
    foreach(part IN LISTS parts)
      string(SUBSTRING ${part} 0 1 first)
      string(TOUPPER ${first} first)
      string(SUBSTRING ${part} 1 -1 rest)
      string(APPEND test_name ${first}${rest})
    endforeach()
    add_test(NAME ${test_name}FuzzReplay
             COMMAND ${name}_fuzz_replay ${ARG_CORPUS} ${ARG_REPLAY_ARGS})
    set_tests_properties(${test_name}FuzzReplay PROPERTIES LABELS unit TIMEOUT 300)
  endif()
  if(SLUICE_FUZZ)
    add_executable(${name}_fuzz ${ARG_SOURCES})
    target_link_libraries(${name}_fuzz PRIVATE ${ARG_DEPS})
    target_link_options(${name}_fuzz PRIVATE -fsanitize=fuzzer,address,undefined)
  endif()
endfunction()
