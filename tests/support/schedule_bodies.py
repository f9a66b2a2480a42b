"""Random JSON bodies for the schedules verbs: plausible fields, wrong types and anything else.

What the hypothesis tests of the door (HTTP and the request parser) draw from:
each body is a request a client might send, from right to absurd.
"""

from __future__ import annotations

from hypothesis import strategies as st

__all__ = ["BODIES", "PLAUSIBLE"]

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)
FIELDS = st.sampled_from(
    [
        "name", "cron", "every", "tz", "gap", "fold", "task", "args", "max_attempts",
        "timeout_s", "catchup", "window", "max_runs", "jitter", "overlap", "max_buffered", "by",
        "from", "to",
    ]
)  # fmt: skip
PLAUSIBLE = st.fixed_dictionaries(
    {},
    optional={
        "name": st.sampled_from(["x", "y"]) | JSON,
        "every": st.sampled_from(["1m", "1s", "99999999999w", "0s"]) | JSON,
        "cron": st.sampled_from(["@daily", "30 2 * 3 0L", "* * * * *"]) | JSON,
        "tz": st.sampled_from(["UTC", "Europe/Berlin", "Nowhere/At_All"]) | JSON,
        "gap": st.sampled_from(["skip", "shift"]) | JSON,
        "task": st.sampled_from(["ping", ""]) | JSON,
        "max_attempts": st.integers(-3, 2000) | JSON,
        "timeout_s": st.floats(-1, 1e9) | JSON,
        "catchup": st.sampled_from(["skip", "latest", "all"]) | JSON,
        "window": st.sampled_from(["1h", "1s"]) | JSON,
        "jitter": st.sampled_from(["0s", "1m"]) | JSON,
        "by": st.text(max_size=5) | JSON,
        "from": st.sampled_from(["2026-01-01T00:00:00Z", "0001-01-01T00:00:00Z"]) | JSON,
        "to": st.sampled_from(["2026-01-02T00:00:00Z", "9999-12-31T00:00:00Z"]) | JSON,
    },
)
BODIES = PLAUSIBLE | st.dictionaries(FIELDS, JSON, max_size=6) | JSON
