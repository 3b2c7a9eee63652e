"""Folders that hold code a process will run (JAX's compiled steps, the worker daemon's compiled modules)."""

from __future__ import annotations

import os
import stat


def private_folder(path: str) -> str | None:
    """Why ``path`` cannot hold this process's code (None: it can). Created (mode 0700) if absent;
    refused when another user owns it or others may write to it: what is loaded from there is run."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.stat(path)
    except OSError as exc:
        return f"cannot create it ({exc})"
    if st.st_uid != os.getuid():
        return f"it belongs to uid {st.st_uid}, not this process's {os.getuid()}"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"others may write to it (mode {stat.S_IMODE(st.st_mode):o})"
    return None
