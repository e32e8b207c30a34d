"""The aggregate store's generation: a number that changes whenever its counts are made again.

The store (tiny.aggregates) draws it at random when it is made and raises it by one at each
rebuild, in the same transaction, and publishes it in ``DATA_DIR/.tiny/aggregates.generation``
(:func:`publish`, before the commit, replacing the file whole: a reader sees the old number or
the new). A process that keeps answers from the store (tiny.live) reads it
(:func:`read_generation`) and learns with one small read that the store was rebuilt or made
again.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from tiny import layout


def generation_path(data_dir: Path) -> Path:
    return layout.state_dir(data_dir) / "aggregates.generation"


def read_generation(data_dir: Path) -> int:
    """The store's generation as it last published it (0: none). The store draws it at random
    when it is made and raises it by one at each rebuild (in the same transaction, with the
    file written before the commit), so a process that keeps answers from the store
    (tiny.live) learns with one small read that it was rebuilt or made again."""
    try:
        fd = os.open(generation_path(data_dir), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0
    try:
        text = os.pread(fd, 32, 0)
    finally:
        os.close(fd)
    try:
        return int(text)
    except ValueError:
        return 0


def publish(path: Path, generation: int) -> None:
    """Write ``generation`` to the generation file ``path`` (replaced whole: a reader sees the old or the new)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_bytes(b"%d\n" % generation)
    os.replace(tmp, path)
