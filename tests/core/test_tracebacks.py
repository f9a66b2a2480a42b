"""streamkit.tracebacks: the bounded, sanitised excerpt kept of a failure of user code."""

from __future__ import annotations

from streamkit.tracebacks import MAX_EXCERPT_BYTES, traceback_excerpt


def _deep(n: int, secret: str) -> None:
    if n == 0:
        raise RuntimeError("the innermost frame raised")
    _deep(n - 1, secret)


def _caught(fn: object, *args: object) -> BaseException:
    try:
        fn(*args)  # type: ignore[operator]
    except BaseException as exc:
        return exc
    raise AssertionError("nothing was raised")


def test_an_excerpt_names_the_line_that_raised_and_the_error() -> None:
    """A short traceback is kept whole: the frames, the source line, and Type: message."""
    text = traceback_excerpt(_caught(_deep, 2, "s"))
    assert text.startswith("Traceback (most recent call last):")
    assert 'raise RuntimeError("the innermost frame raised")' in text
    assert text.rstrip().endswith("RuntimeError: the innermost frame raised")


def test_a_deep_traceback_keeps_its_innermost_frames_within_the_bound() -> None:
    """Past the bound the outer frames are cut, said so, and the innermost frames stay."""
    text = traceback_excerpt(_caught(_deep, 2, "s"), limit=300)
    assert len(text.encode()) <= 300
    assert "earlier lines left out" in text.splitlines()[0]
    assert text.rstrip().endswith("RuntimeError: the innermost frame raised")


def test_an_excerpt_never_holds_local_variables() -> None:
    """The value of a local variable of any frame is not in the excerpt."""
    text = traceback_excerpt(_caught(_deep, 3, "hunter2-api-key"))
    assert "hunter2-api-key" not in text


def test_a_huge_message_is_cut_to_the_bound() -> None:
    """An error whose message alone is over the bound still gives a bounded excerpt."""
    text = traceback_excerpt(ValueError("x" * 50_000))
    assert len(text.encode()) <= MAX_EXCERPT_BYTES
    assert text.startswith("ValueError: xxx")


def test_a_chained_cause_is_kept_while_it_fits() -> None:
    """``raise ... from`` keeps the cause's frames ahead of the error's, as Python prints them."""

    def wrap() -> None:
        try:
            _deep(1, "s")
        except RuntimeError as exc:
            raise KeyError("wrapped") from exc

    text = traceback_excerpt(_caught(wrap))
    assert text.index("RuntimeError: the innermost") < text.index("KeyError: 'wrapped'")
