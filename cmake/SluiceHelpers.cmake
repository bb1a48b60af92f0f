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
