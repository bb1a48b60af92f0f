# Offline validation of the Kubernetes manifests (deploy/k8s), included from
# the top-level CMakeLists.txt. Needs node, kubectl and deploy/k8s's npm
# packages (scripts/install-deps.sh runs `npm ci` there).
#
# k8s_manifests (unit): kubectl kustomize renders the base and every overlay;
#   every object validates against the Kubernetes and Prometheus Operator
#   schemas with no unknown field; Sluice's rules (probes, resources,
#   security, ports and flags against the binaries' --help, selectors,
#   NetworkPolicies, monitors' jobs); ports and addresses against
#   docker-compose.yml when it is there.
# k8s_manifests_start (integration): the same, then each container's
#   command, args and ConfigMap YAML started as the real binary on loopback
#   until it reports SERVING (an unknown config key makes it exit 2).
# k8s_manifests_breakage (unit): two dozen plausible mistakes, one at a
#   time in a copy of deploy/k8s, each failing the validator for its reason.
set(SLUICE_K8S_RUN ${CMAKE_SOURCE_DIR}/deploy/k8s/validate/run.sh)
add_test(NAME k8s_manifests
         COMMAND ${SLUICE_K8S_RUN} validate.mjs --bin-dir ${CMAKE_BINARY_DIR}/bin)
add_test(NAME k8s_manifests_start
         COMMAND ${SLUICE_K8S_RUN} validate.mjs --bin-dir ${CMAKE_BINARY_DIR}/bin --start)
add_test(NAME k8s_manifests_breakage
         COMMAND ${SLUICE_K8S_RUN} breakage_test.mjs --bin-dir ${CMAKE_BINARY_DIR}/bin)
set_tests_properties(k8s_manifests k8s_manifests_breakage PROPERTIES
                     LABELS unit TIMEOUT 300
                     ENVIRONMENT SLUICE_BIN_DIR=${CMAKE_BINARY_DIR}/bin)
set_tests_properties(k8s_manifests_start PROPERTIES
                     LABELS integration TIMEOUT 300
                     ENVIRONMENT SLUICE_BIN_DIR=${CMAKE_BINARY_DIR}/bin)
