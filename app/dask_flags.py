"""The Dask backend flags of sweep, tune, bench sweep and plan: declared once, checked once."""
from __future__ import annotations


def backend_flags(p, local_means: str = "this process") -> None:
    """``--backend local|dask``, ``--dask-scheduler``, ``--workers``: the Dask flags of sweep, tune, bench sweep
    and plan (checked by :func:`check_backend`)."""
    p.add_argument("--backend", choices=("local", "dask"), default="local",
                   help=f"local: {local_means}; dask: a LocalCluster or --dask-scheduler (identical results)")
    p.add_argument("--dask-scheduler", default=None, metavar="ADDR",
                   help="Dask scheduler address (tcp://host:8786; default: a LocalCluster)")
    p.add_argument("--workers", type=int, default=None, metavar="N", help="LocalCluster worker processes (default 2)")


def check_backend(args) -> None:
    """The Dask flags make sense together (one-line ``ValueError`` naming the flag)."""
    if args.backend == "local" and (args.dask_scheduler or args.workers is not None):
        raise ValueError("--dask-scheduler/--workers need --backend dask")
    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers {args.workers}: needs at least 1")
