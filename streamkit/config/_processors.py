"""The processors a configuration names: imported, checked and built before anything starts.

Each ``module:Class`` must import, be a class, subclass
:class:`~streamkit.processor.StreamProcessor` and construct from its kwargs;
no slug may be configured twice (:func:`shared_slug`). Every problem found is
listed in one :class:`~streamkit.errors.InvalidConfig`.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import types

from streamkit.config._settings import HostConfig, ProcessorSpec, ResolvedProcessor
from streamkit.config._sources import invalid
from streamkit.processor import StreamProcessor

__all__ = ["resolve_processors", "shared_slug"]


def resolve_processors(config: HostConfig) -> list[ResolvedProcessor]:
    """Import, check and build every processor of ``config``, in order.

    Each class must import, be a class, subclass
    :class:`~streamkit.processor.StreamProcessor` and construct from its
    kwargs; no two processors may share one slug, on one path or on two (see
    :func:`shared_slug`). Every problem found is listed
    in one :class:`InvalidConfig`; nothing is started either way, though the
    modules named have been imported and the processors that could be built
    were built (constructors must not start work).
    """
    base = StreamProcessor
    problems: list[tuple[str | None, str, str]] = []
    resolved: list[ResolvedProcessor] = []
    claimed: dict[str, int] = {}
    for index, spec in enumerate(config.processors):
        key = f"processors[{index}]"
        try:
            cls = _import_class(spec.class_path, base)
            instance = _construct(cls, spec)
            slug = _slug_of(instance, spec)
        except _Refused as refused:
            problems.append((f"{key}.{refused.field}", refused.problem, refused.fix))
            continue
        first = claimed.get(slug)
        if first is not None:
            earlier = config.processors[first]
            problems.append(
                (
                    key,
                    shared_slug(slug, earlier.path, spec.path)
                    + f" (processors[{first}], {earlier.label}, has it)",
                    "give one of them another slug (its contract's slug), or remove one",
                )
            )
            continue
        claimed[slug] = index
        resolved.append(ResolvedProcessor(spec, instance))
    if problems:
        raise invalid("the processor list", problems)
    return resolved


def shared_slug(slug: str, first_path: str, path: str) -> str:
    """The one rule of slugs in one host, as the refusal states it.

    A processor's slug keys its checkpoint and its lease, and checkpoints are
    kept per slug, not per path: two processors with one slug, on one path or
    on two, would write the same checkpoint row. So a slug runs once per host,
    on one path only.
    """
    where = f"on {first_path!r}" if first_path == path else f"on {first_path!r} and {path!r}"
    return (
        f"processor slug {slug!r} is configured twice, {where}; checkpoints are kept per slug, "
        "so a slug may run on one path only"
    )


class _Refused(Exception):
    def __init__(self, field: str, problem: str, fix: str) -> None:
        super().__init__(problem)
        self.field = field
        self.problem = problem
        self.fix = fix


def _import_class(class_path: str, base: type) -> type:
    module_name, _, attribute = class_path.partition(":")
    try:
        target: object = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (
            module_name == exc.name or module_name.startswith(exc.name + ".")
        ):
            raise _Refused(
                "class",
                f"module {module_name!r} could not be found ({exc})",
                "check the spelling, and install the package into this Python environment "
                "or put its directory on PYTHONPATH",
            ) from exc
        raise _Refused(
            "class",
            f"importing module {module_name!r} failed: {exc}",
            "install the missing dependency into this Python environment",
        ) from exc
    except Exception as exc:
        raise _Refused(
            "class",
            f"importing module {module_name!r} raised {type(exc).__name__}: {exc}",
            "fix the error in that module (run `python -c 'import "
            f"{module_name}'` to see the traceback)",
        ) from exc
    walked = module_name
    for part in attribute.split("."):
        if not hasattr(target, part):
            # Suggest what may be named here: a processor class, where the module has one
            # (the state model beside it is usually the closest name, and the wrong one).
            names = [n for n in dir(target) if not n.startswith("_")]
            processors = [n for n in names if _is_subclass(getattr(target, n, None), base)]
            close = difflib.get_close_matches(part, processors or names, n=1)
            hint = f"did you mean {walked}:{close[0]}? " if close else ""
            raise _Refused(
                "class",
                f"{walked} has no attribute {part!r}",
                f"{hint}name a class defined in {module_name!r}",
            )
        target = getattr(target, part)
        walked = f"{walked}{'.' if ':' in walked else ':'}{part}"
    if not isinstance(target, type):
        kind = "a function" if isinstance(target, types.FunctionType) else type(target).__name__
        raise _Refused(
            "class",
            f"{class_path} is {kind}, not a class",
            "name the StreamProcessor subclass itself, not an instance or a factory",
        )
    if not issubclass(target, base):
        raise _Refused(
            "class",
            f"{class_path} is not a StreamProcessor (its bases are "
            f"{', '.join(b.__qualname__ for b in target.__mro__[1:-1]) or 'object'})",
            "name a subclass of streamkit.processor.StreamProcessor",
        )
    return target


def _construct(cls: type, spec: ProcessorSpec) -> object:
    try:
        return cls(**spec.kwargs)
    except TypeError as exc:
        try:
            signature = f"{cls.__name__}{inspect.signature(cls)}"
        except (TypeError, ValueError):
            signature = f"{cls.__name__}(...)"
        given = ", ".join(sorted(spec.kwargs)) or "none"
        raise _Refused(
            "kwargs",
            f"{spec.class_path} could not be built from kwargs ({given}): {exc}",
            f"pass the keyword arguments {signature} accepts under [processors.kwargs]",
        ) from exc
    except Exception as exc:
        raise _Refused(
            "kwargs",
            f"building {spec.class_path} raised {type(exc).__name__}: {exc}",
            "fix the kwargs (or the constructor) so it builds",
        ) from exc


def _slug_of(instance: object, spec: ProcessorSpec) -> str:
    slug = getattr(getattr(instance, "contract", None), "slug", None)
    if not isinstance(slug, str) or not slug:
        raise _Refused(
            "class",
            f"{spec.class_path} has no contract with a slug",
            "set contract = define_processor_contract(slug=..., ...) on the class",
        )
    return slug


def _is_subclass(value: object, base: type) -> bool:
    return isinstance(value, type) and issubclass(value, base) and value is not base
