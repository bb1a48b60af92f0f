# Habits of the tree, included from the top-level CMakeLists.txt.
#
# format_check: every C++ file is formatted as .clang-format says, except the
#   files written before it was checked in (scripts/format-legacy.txt, a list
#   that only shrinks); scripts/check_format.py. Seconds.
add_test(NAME format_check
  COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/scripts/check_format.py
          --source-dir ${PROJECT_SOURCE_DIR})
set_tests_properties(format_check PROPERTIES LABELS unit TIMEOUT 300)

# tidy_check: clang-tidy with .clang-tidy over the libraries that build
#   without LibTorch (scripts/check_tidy.sh), from the build's compile
#   database. A few minutes on two cores.
add_test(NAME tidy_check
  COMMAND ${PROJECT_SOURCE_DIR}/scripts/check_tidy.sh ${CMAKE_BINARY_DIR})
set_tests_properties(tidy_check PROPERTIES LABELS unit TIMEOUT 1200)
