"""Exceptions of the sluice package (no grpcio needed to import them)."""

from typing import Any, List, Optional


class SluiceError(Exception):
    """A call to a Sluice service failed, or a spec could not be read.

    Attributes:
      code: the gRPC status code (a grpc.StatusCode) the service answered
        with, e.g. INVALID_ARGUMENT for a spec the controller refused,
        NOT_FOUND for an unknown run, UNAVAILABLE when it cannot be reached;
        None for problems found locally (SpecError).
      details: the service's own message, unchanged.
      errors: details split into lines; the controller gives one
        "field: problem" line per problem of a spec.
      method: the RPC, e.g. "SubmitRun"; empty for local problems.
    """

    def __init__(self, message: str, code: Optional[Any] = None, details: str = "",
                 method: str = ""):
        super().__init__(message)
        self.code = code
        self.details = details or message
        self.errors: List[str] = [line for line in self.details.splitlines() if line.strip()]
        self.method = method


class SpecError(SluiceError, ValueError):
    """A run spec that cannot be read: invalid YAML, an unknown field (with
    "did you mean"), a value of the wrong type. ``errors`` has one
    "where: problem" line per problem; str() joins them."""

    def __init__(self, errors: List[str]):
        super().__init__("\n".join(errors))
        self.errors = list(errors)
