# Grafana's provisioning (deploy/grafana), included from the top-level
# CMakeLists.txt. Needs docker-compose (not a Docker engine: `config` only
# reads the files) and PyYAML, both from scripts/install-deps.sh.
#
# grafana_provisioning_test: the provisioned datasource is the one the
#   dashboards pick, every dashboard is mounted where the provider reads (in
#   docker-compose.yml and the host-network file, under --profile grafana) and
#   listed for Kubernetes, and the datasource URL reaches Prometheus on each
#   compose network. Seconds, no containers.
add_test(NAME grafana_provisioning_test
  COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/provisioning_test.py
          --source-dir ${PROJECT_SOURCE_DIR})
set_tests_properties(grafana_provisioning_test PROPERTIES LABELS unit TIMEOUT 300)
