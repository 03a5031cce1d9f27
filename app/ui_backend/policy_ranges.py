"""The legal range of each policy parameter, read from the policy's own checks."""
from __future__ import annotations

import inspect


# ------------------------------------------------------------------ parameter ranges
def _checks_of(cls) -> dict[str, dict]:
    """``{field: {lo, hi, lo_open, hi_open, integer}}`` read from the ``self._check_number(...)`` calls of
    the class's ``__post_init__`` (and its bases'): the ranges the policy itself enforces, not a copy."""
    import ast
    import textwrap

    out: dict[str, dict] = {}
    for klass in cls.__mro__:
        fn = klass.__dict__.get("__post_init__")
        if fn is None:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        except (OSError, TypeError, SyntaxError):
            continue
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("_check_number", "_check_bool") and node.args
                    and isinstance(node.args[0], ast.Constant)):
                continue
            field = node.args[0].value
            if field in out:
                continue  # the subclass's check is the one that binds
            spec = {"type": "bool"} if node.func.attr == "_check_bool" else {"type": "number"}
            names = ("lo", "hi", "lo_open", "hi_open", "integer")
            for name, arg in zip(names, node.args[1:]):
                if isinstance(arg, ast.Constant):
                    spec[name] = arg.value
            for kw in node.keywords:
                if kw.arg in names:
                    try:
                        spec[kw.arg] = ast.literal_eval(kw.value)
                    except ValueError:
                        pass
            out[field] = spec
    return out


def param_ranges(name: str) -> dict[str, dict]:
    """Each numeric/bool parameter's enforced range: ``{"type", "lo", "hi", "lo_open", "hi_open", "integer"}``.

    A composite policy takes its components' parameters and so their checks.
    """
    from policies import list_policies, policy_class, policy_defaults

    cls = policy_class(name)
    classes = [cls]
    if cls.kind == "composite":
        classes += [policy_class(n) for n in list_policies() if policy_class(n).kind in ("sharing", "exit", "block")]
    fields = policy_defaults(name)
    out: dict[str, dict] = {}
    for c in classes:
        for k, v in _checks_of(c).items():
            if k in fields and k not in out:
                out[k] = v
    return out


def range_text(spec: dict | None) -> str:
    """``[1, inf) integer`` style text of a range from :func:`param_ranges`."""
    if not spec:
        return ""
    if spec.get("type") == "bool":
        return "true | false"
    lo, hi = spec.get("lo"), spec.get("hi")
    left = "(" if spec.get("lo_open") or lo is None else "["
    right = ")" if spec.get("hi_open") or hi is None else "]"
    txt = f"{left}{'-inf' if lo is None else f'{lo:g}'}, {'inf' if hi is None else f'{hi:g}'}{right}"
    return txt + (" integer" if spec.get("integer") else "")
