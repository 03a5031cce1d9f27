"""``rksim validate``: predict published serving figures (``sim.bench.validate``) and print each with its ratio."""
from __future__ import annotations

from pathlib import Path

from app.cli_bench import write_json
from app.progress import PROGRESS_HELP


def register(sub) -> None:
    p = sub.add_parser("validate", help="predict published serving figures and print each with the ratio")
    p.add_argument("file", metavar="FILE", help="YAML of published figures (docs/validation.md)")
    p.add_argument("--hardware", default=None, metavar="NAME",
                   help="override every entry's hardware preset (default: the entry's)")
    p.add_argument("--out", default=None, metavar="FILE", help="also write the table as JSON (default: none)")
    p.add_argument("--markdown", default=None, metavar="FILE", help="also write the table as Markdown (default: none)")
    p.add_argument("--band", action="store_true",
                   help="also price every figure with each public fit of its device, with and without the cited model "
                        "runner's host time, and (FP8) CUTLASS's FP8 rate: a low-high band per figure "
                        "(sim.cost.bands; one more run per profile)")
    p.add_argument("--no-host-time", dest="host_time", action="store_false",
                   help="every figure priced without host time per engine step (default: as each figure's run)")
    p.add_argument("--no-frontend", dest="frontend", action="store_false",
                   help="every figure priced without API server time (default: as each figure's run)")
    from app.cli_sim import add_declared
    from sim.replay.runconfig import RunConfig
    add_declared(p, RunConfig, only=("allow_extrapolation",))   # such a figure's status says what lay outside
    p.add_argument("--no-progress", dest="progress", action="store_false", help=PROGRESS_HELP)
    p.set_defaults(func=_cmd_validate)


def _cmd_validate(args) -> int:
    from app.validate_table import format_table, markdown_table
    from sim.bench import validate
    from app.progress import bar
    figs = validate.load_figures(args.file)
    with bar(args.progress, len(figs), "figures priced", "fig") as update:
        df = validate.run_figures(figs, hardware=args.hardware, band=args.band, host_time=args.host_time,
                                  frontend=args.frontend, progress=update,
                                  allow_extrapolation=args.allow_extrapolation)
    print(format_table(df))
    if args.out:
        write_json(Path(args.out), {"file": str(args.file), "rows": df.to_dict(orient="records"),
                                    "families": validate.summary(df), "by_source": validate.by_source(df)})
        print(f"wrote {args.out}")
    if args.markdown:
        from traces.store import atomic_write_text
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(Path(args.markdown), markdown_table(df, args.file))
        print(f"wrote {args.markdown}")
    return 0
