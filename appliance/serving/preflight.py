"""Checks of the host that ``appliance serve`` runs before it binds anything (and so before READY=1).

Everything that can fail at start fails here or in binding, with a :class:`~appliance.errors.ConfigError`
naming the key and the path, so ``appliance serve`` exits 78 (EX_CONFIG) and systemd does not restart it
into the same failure (the unit's ``RestartPreventExitStatus=78``).

- The engine cache directory (``engine.cache_dir``, else ``$CACHE_DIRECTORY``) exists or can be created, is
  writable (a probe file is written, fsynced and removed) and has at least ``engine.min_free_bytes`` free.
- The UID hash key file (``logging.uid_key_file``) is loaded or created 0600.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from appliance.config import Config
from appliance.errors import ConfigError
from appliance.privacy import load_uid_key

__all__ = ["cache_dir", "check_writable_dir", "preflight"]


def cache_dir(cfg: Config, env: Mapping[str, str] | None = None) -> Path | None:
    """The engine cache directory: ``engine.cache_dir``, else systemd's ``$CACHE_DIRECTORY``, else None."""
    env = os.environ if env is None else env
    if cfg.engine.cache_dir:
        return Path(cfg.engine.cache_dir)
    if env.get("CACHE_DIRECTORY"):
        return Path(env["CACHE_DIRECTORY"].split(":")[0])
    return None


def check_writable_dir(directory: Path, key: str, min_free_bytes: int) -> None:
    """Create ``directory`` (0700) if missing, write and remove a probe file, and check the free space."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create {directory} (config key {key}): {e.strerror}") from None
    if not directory.is_dir():
        raise ConfigError(f"{directory} (config key {key}) is not a directory")
    probe = directory / f".appliance-probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"\0" * 4096)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        raise ConfigError(f"cannot write in {directory} (config key {key}): {e.strerror}") from None
    finally:
        probe.unlink(missing_ok=True)
    free = shutil.disk_usage(directory).free
    if free < min_free_bytes:
        raise ConfigError(
            f"{directory} (config key {key}) has {free >> 20} MiB free, below engine.min_free_bytes "
            f"({min_free_bytes >> 20} MiB): the disk is full"
        )


def preflight(cfg: Config, env: Mapping[str, str] | None = None) -> None:
    """Run every host check for ``cfg``; raise ConfigError on the first failure."""
    directory = cache_dir(cfg, env)
    if directory is not None:
        check_writable_dir(directory, "engine.cache_dir", cfg.engine.min_free_bytes)
    load_uid_key(cfg.logging.uid_key_file)
    if any(a.startswith("unix:") for a in cfg.server.listen):
        from appliance.serving.listen import socket_gid

        socket_gid(cfg.server.socket_group)  # checked where the socket is bound; here too for `doctor --config`
