# Prometheus rules and Grafana dashboards (deploy/prometheus, deploy/grafana);
# included from the top-level CMakeLists.txt. Both need Debian's `prometheus`
# package (promtool, prometheus), installed by scripts/install-deps.sh.
#
# observability_static_test: promtool check config / check rules / test rules,
# and the dashboards' JSON structure. Seconds, no processes.
add_test(NAME observability_static_test
  COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/observability_test.py
          --source-dir ${PROJECT_SOURCE_DIR} --static-only)
set_tests_properties(observability_static_test PROPERTIES LABELS unit TIMEOUT 120)

# observability_test: the same, then a real `sluice up` stack trains a short
# run while a real Prometheus scrapes it every second, and every dashboard
# panel, variable and rule expression is evaluated against it.
add_test(NAME observability_test
  COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/observability_test.py
          --source-dir ${PROJECT_SOURCE_DIR})
set_tests_properties(observability_test PROPERTIES
  LABELS integration
  TIMEOUT 600
  ENVIRONMENT "SLUICE_BIN_DIR=${CMAKE_BINARY_DIR}/bin")
