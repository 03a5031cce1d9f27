"""The dashboard's one door into the simulator, the policy library, traces, sweeps and calibration runs.

Every page calls only this package (and :mod:`app.ui_paths` for files), so re-pointing the
dashboard at a changed simulator API is an edit here. Functions are pure: they take
paths and plain values and return plain values or pandas DataFrames, so the pages can
cache them with ``st.cache_data``. No torch is imported (``calibrate.report`` and
``calibrate.fit`` are numpy/scipy only).

The package's modules, one per page concern: :mod:`.words` (metric labels and formats),
:mod:`.targets` (presets, policies, trace facts), :mod:`.simulation`, :mod:`.trace_explorer`,
:mod:`.sweeps`, :mod:`.calibration`, :mod:`.ranges`, :mod:`.deployments`; this face
re-exports their public names, so a page reads ``B.name`` whichever module holds it.
"""
from __future__ import annotations

from app.ui_backend.words import (  # noqa: F401
    BASELINES,
    BYTES_KEYS,
    CI_NOTE,
    KPI_BRANCH,
    KPI_SERVING,
    KPI_TOKEN,
    METRICS,
    PHASES,
    TABLE_BRANCH,
    fmt,
    fmt_ci,
    is_finite_number,
    label)
from app.ui_backend.targets import (  # noqa: F401
    default_hardware,
    observed_sigmas,
    policy_kind,
    policy_table,
    presets,
    trace_facts)
from app.ui_backend.simulation import (  # noqa: F401
    SERVING_OPTIONS,
    TARGET_OPTIONS,
    capacity_note,
    compare,
    hardware_that_serves,
    memory_rules_choices,
    out_of_calibration,
    run,
    scheduler_choices,
    serving_kpis,
    serving_kwargs,
    target_kwargs,
    token_curve,
    why_it_loses)
from app.ui_backend.trace_explorer import (  # noqa: F401
    exit_layers,
    load_trace,
    problem_branches,
    problem_lens,
    problem_list,
    problem_sigma,
    value_ranges)
from app.ui_backend.sweeps import (  # noqa: F401
    default_minimise,
    param_name,
    pareto,
    read_sweep,
    run_small_sweep,
    sweep_param_columns)
from app.ui_backend.calibration import (  # noqa: F401
    SERVE_SUMMARIES,
    calibration_kind,
    calibration_run,
    calibration_serve)
from app.ui_backend.policy_ranges import (  # noqa: F401
    param_ranges,
    range_text)
from app.ui_backend.deployments import (  # noqa: F401
    AS_RELEASED,
    DEPLOYMENT_OPTIONS,
    PLAN_TARGET_OPTIONS,
    REPLICA_KEYS,
    SMALL_PLAN_MAX,
    check_deployment,
    deployment_knee,
    error_field,
    knee_figure,
    moe_routings,
    node_presets,
    per_replica,
    plan_figure,
    plan_frontier,
    precision_choices,
    read_plan,
    routers,
    run_small_plan,
    serving_load,
    slo_text,
    tp_sizes)
