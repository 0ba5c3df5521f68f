"""Files the on-disk caches write (warm_cache's entries, the triton backend's autotuning
choices): written whole or not at all, so a reader in another process never sees a torn
one.  A leaf.

    >>> write_atomic("/tmp/frametrace-example/choice.json", b"{}")
"""
from __future__ import annotations

import os
import tempfile


def write_atomic(path: str, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder (made if
    missing) renamed over it.  OSError (a full disk, a read-only folder) propagates,
    with no temporary file left behind."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
