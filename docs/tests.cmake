# The documentation as a clone shows it, included from the top-level
# CMakeLists.txt.
#
# docs_links_test: every relative link (and #anchor) in the repository's
#   Markdown (README.md, docs/, deploy/, benchmarks/, python/) resolves inside
#   the repository; the docs name no internal tracker numbers nor paths
#   outside it; and the README's row for `sluice` names every verb that
#   `sluice --help` lists (scripts/check_doc_links.py). Seconds.
add_test(NAME docs_links_test
  COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/scripts/check_doc_links.py
          --source-dir ${PROJECT_SOURCE_DIR} --cli ${CMAKE_BINARY_DIR}/bin/sluice)
set_tests_properties(docs_links_test PROPERTIES LABELS unit TIMEOUT 120)
