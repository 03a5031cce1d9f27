"""Streamlit pieces every dashboard page uses: cached backend calls, the path pickers, the error line.

Results are cached with ``st.cache_data`` (keyed on the call's arguments, owned by the
Streamlit server, cleared with it); the pages keep their state in ``st.session_state``.
"""
from __future__ import annotations

import math

import streamlit as st

from app import params as P
from app import ui_backend as B
from app import ui_paths
from sim.replay.session import Session

# ------------------------------------------------------------------ cached backend calls
# One simulator Session per trace, held by the Streamlit server and shared by its script
# threads (the session's lock serialises them): the features and memo tables survive reruns,
# and a trace re-captured in place is reloaded (Session.refresh). Results are keyed on the
# session's trace and stamp.
session = st.cache_resource(show_spinner=False, max_entries=8)(lambda path: Session(path))
_cache = st.cache_data(show_spinner=False, max_entries=512, hash_funcs={Session: Session.cache_key})


def _on_session(cached):
    """``cached`` called with the trace path's :class:`Session` in place of the path."""
    def call(trace, *args, **kwargs):
        return cached(session(str(trace)).refresh(), *args, **kwargs)
    return call


run = _on_session(_cache(B.run))
trace_facts = _on_session(_cache(B.trace_facts))
observed_sigmas = _on_session(_cache(B.observed_sigmas))
hardware_that_serves = _on_session(_cache(B.hardware_that_serves))
compare = _on_session(_cache(B.compare))
token_curve = _on_session(_cache(B.token_curve))
problem_list = _cache(B.problem_list)
problem_branches = _cache(B.problem_branches)
problem_sigma = _cache(B.problem_sigma)
problem_lens = _cache(B.problem_lens)
exit_layers = _on_session(_cache(B.exit_layers))
value_ranges = _cache(B.value_ranges)
read_sweep = _cache(B.read_sweep)
run_small_sweep = _cache(B.run_small_sweep)
read_plan = _cache(B.read_plan)
run_small_plan = _cache(B.run_small_plan)
calibration_run = _cache(B.calibration_run)
calibration_serve = _cache(B.calibration_serve)
param_ranges = _cache(B.param_ranges)
listing = st.cache_data(show_spinner=False, ttl=30)(lambda kind, roots: ui_paths.listing(kind, [ui_paths.Path(r) for r in roots]))


def roots() -> list[str]:
    return [str(r) for r in ui_paths.roots_from()]


def one_line(exc: BaseException) -> str:
    """The first line of an error's message (the simulator's messages already name the field)."""
    msg = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    return (msg.strip().splitlines() or [type(exc).__name__])[0]


def error(exc_or_text) -> None:
    st.error(exc_or_text if isinstance(exc_or_text, str) else one_line(exc_or_text), icon=":material/error:")


def _field_widgets() -> dict[str, str]:
    """``ConfigError.field`` (or ``CapacityError.field``) -> the key, under a page's prefix, of the widget that
    sets it. Every page that builds a RunConfig / Target keys its widgets so (``{prefix}.{suffix}``)."""
    from sim.serving.capacity import ServingConfig
    from sim.base.options import declared
    out = {"model": "model", "hardware": "hardware", "seed": "seed", "mode": "mode",
           # the dashboard runs one GPU: a model whose weights do not fit (the layout's refusal) is the model's
           "tensor_parallel_size": "model", "pipeline_parallel_size": "model",
           "workload.verify_reuses_kv": "verify",
           "arrival_rate": "srv.arrival_rate", "workload.concurrency": "srv.concurrency",
           "workload.n_requests": "srv.n_requests",
           # the precision pickers (weights_picker, kv_picker): the same keys on every page that draws them
           "quantization": "quant", "kv_cache_dtype": "kv_dtype"}
    out.update({f.name: f"srv.{f.name}" for f, _ in declared(ServingConfig)})
    return out


FIELD_WIDGETS = _field_widgets()


class ErrorSlots:
    """Places right under a page's widgets where a simulator error about that widget's field is shown.

    A page makes one per run (it owns it), calls :meth:`under` after drawing each widget of
    :data:`FIELD_WIDGETS`, and :meth:`show` for an error of a run: the error goes beside the widget of
    its ``field`` (never matched on the message's text), once per distinct message.
    """

    def __init__(self, prefix: str):
        self.prefix = prefix
        self._slots: dict[str, object] = {}
        self._shown: dict[str, list[str]] = {}

    def under(self, suffix: str, where=None) -> None:
        """An empty slot under the widget ``{prefix}.{suffix}`` just drawn (``where``: its container)."""
        self._slots[suffix] = (where if where is not None else st).empty()

    def widget_of(self, exc: BaseException) -> str | None:
        """The key of the widget on this page that sets ``exc``'s field (None: no such widget here)."""
        suffix = FIELD_WIDGETS.get(getattr(exc, "field", None))
        return f"{self.prefix}.{suffix}" if suffix in self._slots else None

    def show(self, exc: BaseException, label: str | None = None) -> bool:
        """Show ``exc`` under its field's widget; False (nothing shown) where this page has no widget for it."""
        if self.widget_of(exc) is None:
            return False
        suffix = FIELD_WIDGETS[exc.field]
        msg = f"{label}: {one_line(exc)}" if label else one_line(exc)
        shown = self._shown.setdefault(suffix, [])
        if msg not in shown:
            shown.append(msg)
        with self._slots[suffix].container():
            for m in shown:
                st.error(m, icon=":material/error:")
        return True


def pick(kind: str, label: str, key: str, help: str | None = None, query_param: str | None = None) -> str | None:
    """A select box of the ``kind`` entries under the trace roots; returns the chosen path.

    A ``?query_param=`` in the URL may preselect an entry, but only a listed one: anything else
    (``..``, an absolute path) is refused with one line and the box keeps its default.
    """
    items = listing(kind, tuple(roots()))
    if not items:
        st.info(f"No {kind} under the trace roots ({', '.join(roots())}). "
                f"Start with `rksim dashboard --trace-root DIR` to look elsewhere.")
        return None
    labels = list(items)
    if query_param and key not in st.session_state:
        asked = st.query_params.get(query_param)
        if asked:
            try:
                path = ui_paths.resolve(kind, asked, [ui_paths.Path(r) for r in roots()])
                st.session_state[key] = next(k for k, v in items.items() if v == path or k == asked)
            except ui_paths.PathRefused as exc:
                error(exc)
    # Streamlit drops a widget's state on a page that does not draw it; the last choice is kept
    # under a plain key, so switching pages keeps the trace the user chose (else the bundled one).
    # A widget drawn on another page does not carry its value over either: set it every run.
    keep = f"_keep.{key}"
    want = st.session_state.get(key)
    if want not in labels:
        want = st.session_state.get(keep)
    if want not in labels:
        want = labels[next((i for i, k in enumerate(labels) if k.endswith("trace-gsm8k-persona")), 0)]
    st.session_state[key] = want
    choice = st.selectbox(label, labels, key=key, help=help)
    st.session_state[keep] = choice
    try:
        return ui_paths.resolve(kind, choice, [ui_paths.Path(r) for r in roots()])
    except ui_paths.PathRefused as exc:  # a stale session value
        error(exc)
        return None


def pick_table(kind: str, label: str, key: str, query_param: str, reader):
    """:func:`pick` a file of ``kind`` and read it with ``reader(path) -> (DataFrame, meta)``; None when nothing
    is picked or the file cannot be read (the error is shown, nothing else on the page is lost)."""
    path = pick(kind, label, key=key, query_param=query_param)
    if path is None:
        return None
    try:
        return reader(path)
    except (ValueError, FileNotFoundError) as exc:
        error(exc)
        return None


def text_number(label: str, key: str, flag: str, default="", help: str | None = None, **check):
    """A text box for a number, validated by :func:`app.params.number` (the CLI's check).

    Returns ``(value, ok)``; a bad value shows one line under the box and ``ok`` is False.
    """
    # a value already in the session state (typed, or loaded from another page) wins; no default beside it
    raw = st.text_input(label, value="" if key in st.session_state else str(default), key=key, help=help)
    try:
        return P.number(raw, flag, **check), True
    except ValueError as exc:
        error(exc)
        return None, False


def target_controls(prefix: str, trace: str | None, sidebar: bool = True, slots: ErrorSlots | None = None):
    """Target model, hardware and seed pickers; returns ``(model or None, hardware, seed, ok)``.

    ``slots``: the page's :class:`ErrorSlots`, given a place under each picker.
    """
    where = st.sidebar if sidebar else st.container()
    slots = slots if slots is not None else ErrorSlots(prefix)
    pr = B.presets()
    models = ["(the trace's own model)"] + pr["models"]
    hw = pr["hardware"]
    m = where.selectbox("target model", models, key=f"{prefix}.model",
                        help="cost model's model; decisions always come from the trace's own model")
    slots.under("model", where)
    dh = B.default_hardware()
    # no default index where the session state holds a value (one loaded from another page): Streamlit warns
    h = where.selectbox("hardware", hw, index=None if f"{prefix}.hardware" in st.session_state else
                        (hw.index(dh) if dh in hw else 0), key=f"{prefix}.hardware")
    slots.under("hardware", where)
    with where:
        seed, ok = text_number("simulator seed", f"{prefix}.seed", "--sim-seed", default="0", lo=0, hi=2**32 - 1,
                               integer=True,
                               help="seed of arrivals and stochastic policies (the CLI's --sim-seed)")
    slots.under("seed", where)
    return (None if m == models[0] else m), h, (seed if ok else 0), ok


QUANT_HELP = ("as released: the checkpoint's own format, as vllm serve loads it (gpt-oss: mxfp4 experts, "
              "DeepSeek-V3: fp8; else its dtype); fp8: linear layers' weights one byte, GEMMs at the FP8 peak; "
              "mxfp4: MoE experts at 4.25 bits; none: 16-bit weights (--quantization)")
KV_HELP = "auto: the model's dtype; fp8: one byte per element, twice the tokens per GB (--kv-cache-dtype)"


def weights_picker(key: str, where=None) -> str | None:
    """The weights picker ``{key}.quant`` (vLLM's ``--quantization``); None: as released."""
    q = (where or st).selectbox("weights (--quantization)", B.precision_choices()[0], key=f"{key}.quant",
                                help=QUANT_HELP)
    return None if q == B.AS_RELEASED else q


def kv_picker(key: str, where=None) -> str | None:
    """The KV-cache picker ``{key}.kv_dtype`` (vLLM's ``--kv-cache-dtype``); None: auto."""
    kv = (where or st).selectbox("KV cache (--kv-cache-dtype)", B.precision_choices()[1], key=f"{key}.kv_dtype",
                                 help=KV_HELP)
    return None if kv == "auto" else kv


def precision_controls(prefix: str, slots: ErrorSlots, sidebar: bool = True) -> dict:
    """The weights and KV-cache pickers under the target pickers, each with its error slot; returns the target
    keywords of ``sim.api.simulate`` every run of the page takes (What-if, Compare, Sweeps)."""
    where = st.sidebar if sidebar else st.container()
    with where:
        q = weights_picker(prefix)
        slots.under("quant")
        kv = kv_picker(prefix)
        slots.under("kv_dtype")
    return {"quantization": q, "kv_cache_dtype": kv}


def refusal_advice(trace: str, name: str, model, hardware: str, mode: str) -> str:
    """One sentence for a target the hardware profile refuses: which hardware would serve it, or, where this
    hardware serves it one problem at a time, that the serving load went past the calibrated range."""
    serves = hardware_that_serves(trace, model)
    if hardware in serves:
        return (f"{hardware} serves {name} one problem at a time; in {mode} mode the load went past its "
                f"calibrated range: lower the arrival rate or concurrency"
                + (f", or choose hardware fitted for more ({', '.join(h for h in serves if h != hardware)})."
                   if len(serves) > 1 else "."))
    if serves:
        return (f"{name} on {hardware} is outside what that hardware profile was fitted for. "
                f"Hardware that would serve it: {', '.join(serves)} (choose it in the sidebar).")
    return f"No shipped hardware preset serves {name}; fit one with `rksim calibrate fit`."


def finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
