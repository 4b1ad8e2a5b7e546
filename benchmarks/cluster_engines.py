"""Dask or Ray for a search's compiles (cluster.py): what each costs a search on a local cluster of 2 single-threaded
workers: seconds to start it, a task's round trip (median of 30), bringing back 5 MiB (a build's libraries, median of
10), and the memory of this process and everything it started. Measures the engine given, which must be importable
(Ray is not among dcnb's extras: install it beside, ``pip install --target DIR ray`` and put DIR on PYTHONPATH).
One JSON line with ``--json``.

    .venv/bin/python benchmarks/cluster_engines.py --engine dask --json
    PYTHONPATH=/tmp/ray .venv/bin/python benchmarks/cluster_engines.py --engine ray --json
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import time

from common import print_result


def _noop(x):
    return x


def _blob(size: int) -> bytes:
    return b"x" * size


def _rss_mib() -> float:
    """Resident memory of this process and every process below it, from /proc."""
    children: dict[int, list[int]] = {}
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            children.setdefault(int(stat.read_text().rsplit(")", 1)[1].split()[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    total, pending = 0, [os.getpid()]
    while pending:
        pid = pending.pop()
        pending.extend(children.get(pid, []))
        try:
            total += int(pathlib.Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            continue
    return total / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("dask", "ray"), required=True)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    if args.engine == "dask":
        from dask.distributed import Client, LocalCluster

        client = Client(LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0"))

        def run(fn, *a):
            return client.submit(fn, *a, pure=False).result()

        version = __import__("distributed").__version__
    else:
        import ray

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        remote = {_noop: ray.remote(_noop), _blob: ray.remote(_blob)}

        def run(fn, *a):
            return ray.get(remote[fn].remote(*a))

        version = ray.__version__
    start_s = time.perf_counter() - started
    run(_noop, 0)
    trips, blobs = [], []
    for i in range(30):
        t = time.perf_counter()
        run(_noop, i)
        trips.append(time.perf_counter() - t)
    for _ in range(10):
        t = time.perf_counter()
        run(_blob, 5 * 2**20)
        blobs.append(time.perf_counter() - t)
    print_result(
        {
            "bench": "cluster_engines",
            "engine": args.engine,
            "version": version,
            "start_s": round(start_s, 2),
            "round_trip_ms": round(statistics.median(trips) * 1e3, 2),
            "bring_back_5mib_ms": round(statistics.median(blobs) * 1e3, 1),
            "rss_mib": round(_rss_mib()),
            "load": round(os.getloadavg()[0], 2),
        },
        args.json,
    )


if __name__ == "__main__":
    main()
