"""Tool errors, routed by class.

The class of an error decides who handles it, and nothing else does:

- ``ToolValidationError``: the model's arguments were wrong. The tool did
  nothing. The error goes back to the model as repairable feedback; it is not
  an infrastructure failure, so it is never retried.
- ``ToolExecutionError``: a known, terminal failure of the tool's work (a
  service refused the request). Retrying would not help; the model is told.
- ``ToolRetryableError``: a transient failure. It is raised out of the activity
  so the durability engine's retry policy (Temporal's) applies.

Any other exception is a bug: it is retried like a transient failure, which
is what keeps a run alive until a fixed worker is deployed (the hot-fix case).
"""

from __future__ import annotations


class ToolError(Exception):
    """Base of the classified tool errors."""

    #: the ``type`` of the Temporal ApplicationError this error becomes
    error_type = "ToolError"


class ToolValidationError(ToolError):
    """Bad arguments: model-visible, repairable, not retried."""

    error_type = "ToolValidationError"


class ToolExecutionError(ToolError):
    """A known terminal failure: model-visible, not retried."""

    error_type = "ToolExecutionError"


class ToolRetryableError(ToolError):
    """A transient failure: retried by the engine's retry policy."""

    error_type = "ToolRetryableError"


class ModelConfigurationError(Exception):
    """The model cannot be called as configured (unknown model, bad key): not retried."""

    error_type = "ModelConfigurationError"


#: an environment that cannot be built here (no isolation, no browser, no Docker engine) or is misconfigured
ENV_UNAVAILABLE = "EnvUnavailable"

#: error types the retry policies never retry
NON_RETRYABLE_ERROR_TYPES = [
    ToolValidationError.error_type,
    ToolExecutionError.error_type,
    ModelConfigurationError.error_type,
    ENV_UNAVAILABLE,
]
