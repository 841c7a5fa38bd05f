"""`UploadsConfig`: the settings the upload service reads, and no other. Each field is the
setting of its name (`gateway.config.config_from`); what several of them decide together
is a method.
"""

from __future__ import annotations

import dataclasses

from gateway.budget import Quota
from gateway.uploads.limits import ArchiveLimits


@dataclasses.dataclass(frozen=True)
class UploadsConfig:
    allow_uploads: bool
    # what an archive may hold
    max_upload_bytes: int
    max_unpacked_bytes: int
    max_archive_entries: int
    max_archive_file_bytes: int
    max_archive_ratio: float
    # what one user keeps
    max_uploads_per_user: int
    max_upload_store_bytes_per_user: int
    # uploads checked and kept at once
    max_concurrent_uploads: int
    max_concurrent_uploads_per_user: int
    upload_wait_timeout: float
    # what a run's staged files may be, as a run's kept files are read back (`kept.py`)
    max_files: int
    max_file_bytes: int
    max_files_bytes: int

    def archive_limits(self) -> ArchiveLimits:
        return ArchiveLimits(
            upload_bytes=self.max_upload_bytes,
            unpacked_bytes=self.max_unpacked_bytes,
            entries=self.max_archive_entries,
            file_bytes=self.max_archive_file_bytes,
            ratio=self.max_archive_ratio,
        )

    def quota(self) -> Quota:
        """What one user keeps of their uploads."""
        return Quota(count=self.max_uploads_per_user, bytes=self.max_upload_store_bytes_per_user)
