# cmake -DIN_DIR=<protoc out>/grpc/health/v1 -DOUT_DIR=<pkg>/_health -P relocate_health.cmake
#
# Moves the generated grpc.health.v1 modules into the sluice package. The stub
# module imports its messages as `from grpc.health.v1 import health_pb2`,
# which would look inside grpcio's `grpc` package (and fail, or shadow it if we
# generated a top-level grpc/); it is rewritten to import them from beside it.
# The proto's package stays grpc.health.v1, so the service name on the wire is
# unchanged.
file(MAKE_DIRECTORY ${OUT_DIR})
file(READ ${IN_DIR}/health_pb2.py messages)
file(WRITE ${OUT_DIR}/health_pb2.py "${messages}")
file(READ ${IN_DIR}/health_pb2_grpc.py stubs)
string(REPLACE "from grpc.health.v1 import health_pb2"
               "from sluice._health import health_pb2" rewritten "${stubs}")
if(rewritten STREQUAL stubs)
  message(FATAL_ERROR "relocate_health: health_pb2_grpc.py no longer imports "
                      "`from grpc.health.v1 import health_pb2`; update this script")
endif()
file(WRITE ${OUT_DIR}/health_pb2_grpc.py "${rewritten}")
file(WRITE ${OUT_DIR}/__init__.py
     "\"\"\"grpc.health.v1 messages and stubs, kept inside sluice so that grpcio's grpc\n"
     "module is never shadowed.\"\"\"\n")
