# Tests of the Python package: run with the interpreter the package targets
# (Debian's /usr/bin/python3) against <build>/python, so they test what was
# generated and copied there, not the source tree.
set(sluice_python_test_env
  "PYTHONPATH=${CMAKE_BINARY_DIR}/python"
  "SLUICE_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
  "SLUICE_SOURCE_DIR=${CMAKE_SOURCE_DIR}"
  "PYTHONDONTWRITEBYTECODE=1"
  "MPLBACKEND=Agg")

# The package imports beside grpcio; specs read as the CLI reads them.
add_test(NAME python_spec_test
  COMMAND ${SLUICE_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/tests/spec_test.py)
set_tests_properties(python_spec_test PROPERTIES
  ENVIRONMENT "${sluice_python_test_env}" LABELS unit TIMEOUT 120)

# sluice.report on a real run's files kept in testdata/report/, and bad input.
add_test(NAME python_report_test
  COMMAND ${SLUICE_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/tests/report_test.py)
set_tests_properties(python_report_test PROPERTIES
  ENVIRONMENT "${sluice_python_test_env}" LABELS unit TIMEOUT 300)

# The client against a real `sluice up` stack: submit, watch, list, get,
# cancel, bad specs, a controller restart mid-watch, the example script, and
# sluice.report on a run it made.
add_test(NAME python_client_process_test
  COMMAND ${SLUICE_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/tests/client_process_test.py)
set_tests_properties(python_client_process_test PROPERTIES
  ENVIRONMENT "${sluice_python_test_env}" LABELS integration TIMEOUT 600)

# The client against `sluice up --tls`: CA and token found through
# endpoints.json, a run over TLS, the viewer token refused a cancel, no
# token and plaintext refused.
add_test(NAME python_client_tls_process_test
  COMMAND ${SLUICE_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/tests/client_tls_process_test.py)
set_tests_properties(python_client_tls_process_test PROPERTIES
  ENVIRONMENT "${sluice_python_test_env}" LABELS integration TIMEOUT 600)

# The package as a user installs it: the build's wheel, and `pip install
# ./python` from a copy of the checkout, each into a fresh venv (offline:
# --system-site-packages over Debian's modules, --no-deps); then configs/
# smoke.yaml submitted and watched from the wheel's venv against a real
# `sluice up`, and `sluice-report` on that run. The test process itself has no
# PYTHONPATH to the build tree.
add_test(NAME python_package_test
  COMMAND ${SLUICE_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/tests/package_test.py)
set_tests_properties(python_package_test PROPERTIES
  ENVIRONMENT "SLUICE_BIN_DIR=${CMAKE_BINARY_DIR}/bin;SLUICE_SOURCE_DIR=${CMAKE_SOURCE_DIR};SLUICE_PYTHON_WHEEL=${SLUICE_PYTHON_WHEEL};PYTHONDONTWRITEBYTECODE=1"
  LABELS integration TIMEOUT 900)
