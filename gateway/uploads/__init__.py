"""Uploaded archives: inspected and unpacked within limits (`archives`), kept per user for a
while (`store`), and unpacked into a run's working folder (`attach`)."""

from gateway.uploads.archives import ArchiveLimits, Unpacked, read_archive
from gateway.uploads.service import ShelvedUpload, UploadService

__all__ = ["ArchiveLimits", "ShelvedUpload", "Unpacked", "UploadService", "read_archive"]
