"""Who a sandbox runs as, and the workspace it needs mounted first: one per backend.

- a sandbox without a workspace: a uid of its own, leased from the sandboxes' range
  (uids.py) when it is created and given back when it is destroyed;
- a run in a user's workspace: that user's own uid (owners.py), with their workspace
  image mounted first (workspace_images.py); without quotas (`--workspace-bytes 0`, or a
  machine that cannot make them) the same uid, owner of a plain folder;
- a run in an admin folder (`admin_dirs`, the operator's own): `sandbox_uid`, no quota;
- a gateway that cannot change users (the local backend, not root): its own uid.

Every sandbox keeps the one gid `sandbox_gid`: no kernel counter is per gid, and files in
a workspace are never seen by another user's sandbox.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from pathlib import Path

from gateway.auth import is_user_folder
from gateway.models.request import WorkspaceRef
from gateway.sandbox.owners import WorkspaceOwners
from gateway.sandbox.uids import UidLease, UidLeases
from gateway.sandbox.workspace_images import WorkspaceImages

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TenancyConfig:
    """The settings tenancy reads (each field takes the setting of its name)."""

    sandbox_uid: int
    sandbox_uids: int
    sandbox_gid: int
    workspaces: Path | None
    workspace_bytes: int
    workspace_inodes: int


@dataclasses.dataclass
class Identity:
    """The uid and gid one sandbox runs as; `release()` when it is destroyed."""

    uid: int
    gid: int
    lease: UidLease | None = None

    def release(self) -> None:
        if self.lease is not None:
            self.lease.release()


class Tenancy:
    """Who each sandbox of one backend runs as; made by the backend, asked by its `create`."""

    def __init__(self, config: TenancyConfig, multi_user: bool) -> None:
        self.config = config
        self.multi_user = multi_user
        self.switch_users = True  # False: every sandbox runs as the gateway's own user
        self.leases = UidLeases(config.sandbox_uid + 1, config.sandbox_uids)
        self.owners: WorkspaceOwners | None = None  # with workspaces: each user's uid
        self.images: WorkspaceImages | None = None  # with quotas

    async def startup(self, switch_users: bool) -> None:
        """Before the first sandbox: the lease folder, and whether workspaces get quotas
        (refusing several users' workspaces without one)."""
        self.switch_users = switch_users
        if switch_users:
            await asyncio.to_thread(self.leases.prepare)
        config = self.config
        if config.workspaces is None:
            return
        self.owners = WorkspaceOwners(
            config.workspaces,
            first_uid=config.sandbox_uid + config.sandbox_uids + 1,
            gid=config.sandbox_gid,
            legacy_uid=config.sandbox_uid,
        )
        if config.workspace_bytes == 0:
            return
        images = WorkspaceImages(self.owners, config.workspace_bytes, config.workspace_inodes)
        why = await asyncio.to_thread(images.probe) if switch_users else "it cannot switch users"
        if why is not None:
            if self.multi_user:
                raise RuntimeError(
                    f"Workspaces get their size limit from a file system image of each "
                    f"user's own, and {why}: refusing to let several users share the host's "
                    "disk without it. Run the gateway as root on a machine with loop "
                    "devices and mkfs.ext4, or pass --workspace-bytes 0 to accept "
                    "workspaces without a size limit."
                )
            log.warning("workspaces have no size limit here: %s", why)
            return
        swept = await asyncio.to_thread(images.sweep)
        if swept:
            log.warning("unmounted %d workspaces a gateway that stopped had left mounted", swept)
        self.images = images

    async def shutdown(self) -> None:
        """After every sandbox is destroyed: let go of the workspace mounts."""
        if self.images is not None:
            await asyncio.to_thread(self.images.close)

    async def identity(self, workspace: WorkspaceRef | None) -> Identity:
        """Who a new sandbox runs as; its workspace's image is mounted first."""
        gid = self.config.sandbox_gid
        if not self.switch_users:
            user = self._user_of(workspace)
            if user is not None and self.owners is not None:  # quota-less, but checked alike
                await asyncio.to_thread(self.owners.refuse_hidden, user)
            return Identity(os.getuid(), os.getgid())
        if workspace is None:
            taking = asyncio.ensure_future(asyncio.to_thread(self.leases.take))
            try:
                lease = await asyncio.shield(taking)
            except asyncio.CancelledError:  # the thread goes on: give back what it took
                taking.add_done_callback(_give_back)
                raise
            return Identity(lease.uid, gid, lease)
        return Identity(await self._user_uid(workspace), gid)

    async def _user_uid(self, workspace: WorkspaceRef) -> int:
        user = self._user_of(workspace)
        if user is None:
            return self.config.sandbox_uid  # an admin folder: the operator's own
        if self.images is not None:
            return await asyncio.to_thread(self.images.open_user, user)
        assert self.owners is not None
        return await asyncio.to_thread(self.owners.open_plain, user)

    def _user_of(self, workspace: WorkspaceRef | None) -> str | None:
        """The user whose folder `workspace` lies in; None for an admin folder (or none)."""
        if workspace is None or workspace.root != self.config.workspaces or not workspace.parts:
            return None
        user = workspace.parts[0]
        assert is_user_folder(user), user  # requests.py never names another
        return user


def _give_back(taking: asyncio.Future[UidLease]) -> None:
    if not taking.cancelled() and taking.exception() is None:
        taking.result().release()
