"""The Docker engine, reached through the docker SDK: one place that connects and says why it cannot.

Used by the ``browser_docker`` environment and by the chaos harness's container workers. The SDK
(``pip install 'docker>=7'``) is imported lazily, so nothing else needs it. ``docker_engine_available``
never raises: it says whether an engine answers and, if not, why (tests skip on that reason).
"""

from __future__ import annotations

from typing import Any

DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"


class DockerEngineUnavailable(RuntimeError):
    pass


def docker_host() -> str:
    """The engine address the docker SDK will use (``DOCKER_HOST`` or the default socket)."""
    from agent.env_options import option

    return option("DOCKER_HOST") or DEFAULT_DOCKER_HOST


def connect(timeout_s: float = 60.0) -> Any:
    """A ``docker.DockerClient`` that has answered a ping; raises DockerEngineUnavailable saying why not."""
    try:
        import docker
    except ImportError as e:
        raise DockerEngineUnavailable(f"docker SDK not installed ({e}); install it with: pip install 'docker>=7'") from e
    try:
        client = docker.from_env(timeout=int(timeout_s))
        client.ping()
    except Exception as e:  # the SDK raises DockerException, requests errors or OSError depending on the transport
        raise DockerEngineUnavailable(
            f"no engine reachable at {docker_host()} ({e}); start Docker or point DOCKER_HOST at a running engine"
        ) from e
    return client


def docker_engine_available() -> tuple[bool, str]:
    """(True, "docker engine <version> at <url>") or (False, why not). Never raises."""
    try:
        client = connect(timeout_s=5.0)
    except DockerEngineUnavailable as e:
        return False, str(e)
    except Exception as e:  # never raise: this decides whether tests skip
        return False, f"docker engine check failed at {docker_host()}: {e!r}"
    try:
        version = client.version().get("Version", "unknown")
        return True, f"docker engine {version} at {client.api.base_url}"
    except Exception as e:
        return False, f"docker engine at {docker_host()} answered ping but not version ({e!r})"
    finally:
        client.close()

