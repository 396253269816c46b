"""The Ray cluster of a run (`actors.mode: ray`): Ray installed and the cluster that
`ray.address` names reachable, checked before a run folder is written; and Ray joined, or
started on this machine, for the run (`RayRuntime`)."""
from __future__ import annotations

import logging
import math
import os
import signal
import socket
import threading
from typing import Any

from ..config import Config, RayConfig
from ..files import excerpt

__all__ = ["ClusterError", "RayRuntime", "check_cluster", "import_ray"]

_EXTRA = "install the 'ray' extra: pip install \"a3c-replay[ray]\" (from a clone: pip install -e \".[ray]\")"


_CONNECT_TIMEOUT_S = 5.0


class ClusterError(RuntimeError):
    """Ray is not installed, or the cluster `ray.address` names cannot be reached."""


def import_ray():
    """The ray module, or a ClusterError naming the extra to install."""
    try:
        import ray
    except ModuleNotFoundError as error:
        if (error.name or "ray").partition(".")[0] != "ray":
            raise  # Ray is there, but something it imports is not: Ray's own message says what
        raise ClusterError(f"actors.mode ray needs Ray, which is not installed; {_EXTRA}") from None
    return ray


def check_cluster(cfg: RayConfig) -> None:
    """Ray is installed and the cluster `cfg.address` names answers, checked before a run
    folder is written: a TCP connection to the head's port (nothing is joined or started)."""
    import_ray()
    address = cfg.address
    if address is None:
        return  # a Ray instance of the run's own
    if address == "auto":
        address = _auto_address()
        if address is None:
            raise ClusterError(
                "ray.address: auto, but no Ray cluster runs on this machine (none was started with "
                "`ray start --head` here, and RAY_ADDRESS is not set); start one, set ray.address to "
                "the head's host:port, or to null for a Ray instance of the run's own")
        if "://" in address:
            return  # a Ray Client address (ray://...): ray.init says what is wrong with it
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=_CONNECT_TIMEOUT_S):
            pass
    except (OSError, ValueError) as error:
        reason = "timed out" if isinstance(error, TimeoutError) else \
            getattr(error, "strerror", None) or str(error) or type(error).__name__
        raise ClusterError(
            f"ray.address: no Ray cluster answers at {address} ({reason}); check that the head "
            f"node runs `ray start --head --port={port}`, that {host} is reachable from this "
            f"machine, and that no firewall closes port {port}") from None


def _auto_address() -> str | None:
    """Where ray.init(address="auto") would go: RAY_ADDRESS, else the cluster that `ray start`
    last started on this machine; None when there is none."""
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"]
    try:
        from ray._private.services import canonicalize_bootstrap_address_or_die
    except ImportError:  # a Ray without this function: ray.init looks for itself
        return "auto"
    try:
        return canonicalize_bootstrap_address_or_die("auto")
    except ConnectionError:
        return None


class RayRuntime:
    """Ray for one run. With `ray.address` null, a Ray instance started for the run on
    127.0.0.1 (nothing listens on another interface) and stopped by `close()`; with auto or
    host:port, the cluster joined, and left by `close()`. A process connected to Ray already
    (its own ray.init) keeps that connection, open."""

    def __init__(self, cfg: Config):
        ray = self.ray = import_ray()
        self.started = self._connected = False
        if ray.is_initialized():
            return
        rc, actors = cfg.ray, cfg.actors
        kwargs: dict[str, Any] = dict(include_dashboard=False, logging_level=logging.WARNING,
                                      runtime_env=rc.runtime_env)
        if rc.address is None:
            # Room for every actor, as process actors get it: they share the cores.
            kwargs.update(address="local", _node_ip_address="127.0.0.1",
                          num_cpus=max(os.cpu_count() or 1, math.ceil(actors.num * rc.num_cpus)),
                          resources={name: amount * actors.num
                                     for name, amount in (rc.resources or {}).items()} or None)
        else:
            kwargs["address"] = rc.address
        in_main = threading.current_thread() is threading.main_thread()
        sigterm = signal.getsignal(signal.SIGTERM) if in_main else None
        try:
            ray.init(**kwargs)
        except Exception as error:  # ConnectionError, RuntimeError, ValueError: all say the same
            what = "start a Ray instance on this machine" if rc.address is None else \
                f"join the Ray cluster at {rc.address}"
            first = excerpt(error, 200)
            raise ClusterError(f"ray.address: could not {what} ({type(error).__name__}: {first}); "
                               f"check `ray status` there, and that its Ray version is "
                               f"{ray.__version__} as here") from None
        finally:
            if sigterm is not None:
                # ray.init makes SIGTERM exit at once; the command line's handler stops a run
                # as Ctrl-C does (final checkpoint, nothing left behind).
                signal.signal(signal.SIGTERM, sigterm)
        self._connected, self.started = True, rc.address is None

    def close(self) -> None:
        """Leave the cluster; a Ray instance started for the run stops with all its processes."""
        if self._connected:
            self._connected = False
            self.ray.shutdown()
