"""Logging to the host's log (the `podstamp:plugin/host` import).

Inside the component the lines go to the host, which tags them with the
plugin and the pod; natively (a plugin's unit tests) they go to stderr.
"""

import sys

try:  # The bindings exist only inside the component.
    from wit_world.imports import host as _host
except ImportError:
    _host = None


def log(level: str, message: str) -> None:
    """Writes one line at `level`: error, warn, info, debug or trace."""
    if _host is None:
        print(f"[plugin {level}] {message}", file=sys.stderr)
        return
    _host.log(_host.LogLevel[level.upper()], str(message))


def error(message: str) -> None:
    log("error", message)


def warn(message: str) -> None:
    log("warn", message)


def info(message: str) -> None:
    log("info", message)


def debug(message: str) -> None:
    log("debug", message)


def trace(message: str) -> None:
    log("trace", message)
