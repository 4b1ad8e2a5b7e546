"""The processes a test left running, read from /proc (no psutil in the environment)."""

import pathlib

#: fields of /proc/PID/stat after the command's name
PPID, PGRP = 1, 2


def live(field: int, value: int) -> list[int]:
    """The pids of the live processes (zombies aside) whose stat ``field`` (PPID, PGRP) is ``value``."""
    found = []
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[field]) == value:
            found.append(int(stat.parent.name))
    return found
