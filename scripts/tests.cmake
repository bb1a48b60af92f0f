# Habits of the tree, included from the top-level CMakeLists.txt.
#
# format_check: every C++ file is formatted as .clang-format says, except the
#   files written before it was checked in (scripts/format-legacy.txt, a list
#   that only shrinks); scripts/check_format.py. Seconds.
add_test(NAME format_check
  COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/scripts/check_format.py
          --source-dir ${PROJECT_SOURCE_DIR})
set_tests_properties(format_check PROPERTIES LABELS unit TIMEOUT 300)
