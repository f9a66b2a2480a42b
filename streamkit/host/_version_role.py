"""Where a runner's contract version stands among its slug's versions: serving, shadow, retired.

Checkpoints are kept per contract version and one version of a slug serves
(:mod:`streamkit.checkpoint`). A host reads, before it takes a lease for a
processor, which version serves and how its own version's row stands, and
:class:`VersionRole` keeps the answer:

- its version serves, or none does yet: it takes the serving lease
  ``(path, slug)`` and offers the processor to placement, as always;
- another version serves: it builds its own in the shadow under a lease of
  its own, ``(path, slug~version)`` (:func:`~streamkit.checkpoint.shadow_lease_slug`), and does not
  offer the processor (a host running the serving version keeps serving it,
  effects and all, as in a rolling deploy); its cutover takes the serving
  lease over in the same transaction (see
  :mod:`streamkit.backends._fenced_checkpoints`);
- a cutover replaced its version (its row is *retired*): it stands aside,
  takes no lease and offers nothing, so hosts still running old code never
  build it again and cut back; ``status`` says so, and an operator's
  rollback lifts it.
"""

from __future__ import annotations

from typing import Any

import structlog

from streamkit.checkpoint import SHADOW_MARK, ReduceCheckpoint, shadow_lease_slug
from streamkit.errors import LeaseLost
from streamkit.protocols import HostStore

__all__ = ["VersionRole"]

_log = structlog.get_logger("streamkit.host")


class VersionRole:
    """One runner's version among its slug's versions, as last read (see the module)."""

    __slots__ = ("_path", "_slug", "_version", "retired", "serving_version", "shadow", "switching")

    def __init__(self, slug: str, version: str, path: str) -> None:
        self._slug = slug
        self._version = version
        self._path = path
        self.serving_version: str | None = None
        """The slug's serving version as last read (None: none serves yet)."""
        self.retired: dict[str, Any] | None = None
        """Set while a cutover's replacement of this version stands: ``{serving, retired_at}``."""
        self.shadow = False
        """Whether the lease this host takes (or holds) for it is the shadow lease."""
        self.switching = False
        """Set from this version's cutover until the engine serving under the serving lease
        has started here (the one built in the shadow is being replaced meanwhile)."""

    def read(self, serving: ReduceCheckpoint | None, own: ReduceCheckpoint | None) -> None:
        """Take in the slug's serving row and this version's row, as just read."""
        self.serving_version = None if serving is None else serving.reducer_version
        retired = (
            own is not None
            and own.retired_at is not None
            and not own.serving
            and serving is not None
        )
        if retired and self.retired is None:
            assert own is not None
            assert serving is not None
            self.retired = {"serving": serving.reducer_version, "retired_at": own.retired_at}
            _log.warning(
                "processor.retired",
                slug=self._slug,
                path=self._path,
                version=self._version,
                serving=serving.reducer_version,
                retired_at=own.retired_at,
                detail="this host runs a version a cutover replaced: it leaves the processor "
                "to hosts running the serving version until a rollback reinstates it",
            )
        elif not retired and self.retired is not None:
            self.retired = None
            _log.info(
                "processor.reinstated", slug=self._slug, path=self._path, version=self._version
            )
        self.shadow = self.serving_version not in (None, self._version)

    def lease_slug(self) -> str:
        """The lease to take: the serving one, or this version's shadow lease."""
        return shadow_lease_slug(self._slug, self._version) if self.shadow else self._slug

    @property
    def offers_serving(self) -> bool:
        """Whether this host offers to serve the processor (placement counts it)."""
        return self.retired is None and not self.shadow

    def cut_over(self) -> None:
        """This version's cutover committed: it serves now (its new engine is on the way)."""
        self.serving_version = self._version
        self.shadow = False
        self.switching = True

    def served(self) -> None:
        """The engine serving after the cutover started (or none will: the host stops)."""
        self.switching = False

    async def replaced_by(self, store: HostStore, error: LeaseLost) -> str | None:
        """The version a cutover replaces this one with, if that is why its lease went.

        Either it serves already, or the lease's new holder builds it in the shadow: a
        cutover fences the serving version first, then reduces the last stretch, then
        commits (see ``streamkit.engine._shadow``), so the fence may be seen first.
        """
        if self.shadow:
            return None
        try:
            serving, _ = await store.version_rows(self._slug, self._version)
            if serving is not None and serving.reducer_version != self._version:
                return serving.reducer_version
            holder = error.details.get("holder")
            for lease in await store.leases():
                slug, mark, version = lease.slug.partition(SHADOW_MARK)
                ours = mark and slug == self._slug and lease.path == self._path
                if ours and lease.owner == holder and not lease.released:
                    return version
        except Exception:  # the database may be why the lease went: then it is a warning
            return None
        return None
