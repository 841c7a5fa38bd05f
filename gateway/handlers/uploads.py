"""`POST /v1/uploads`: receive an archive (raw body or one multipart file), check it, keep
it for the caller's runs, and answer `{id, entries, unpacked_bytes}` (201)."""

from __future__ import annotations

from tornado.httputil import HTTPFile, HTTPInputError, parse_body_arguments

from gateway.errors import (
    Forbidden,
    GatewayError,
    InvalidRequest,
    PayloadTooLarge,
    UnsupportedMediaType,
)
from gateway.handlers.base import BaseHandler
from gateway.uploads.archives import LENIENT_TYPES, RAW_TYPES, archive_error
from gateway.uploads.service import UploadService

MULTIPART_SLACK = 64 * 1024  # room for the multipart boundaries and part headers


class UploadsHandler(BaseHandler):
    @property
    def limit(self) -> int:
        return self.config.max_upload_bytes + MULTIPART_SLACK

    def prepare(self) -> None:
        if not self.policy.allow_uploads:
            self.refuse_foreign()
            self.principal = self.authenticate()
            raise Forbidden(
                "Archive uploads are disabled on this gateway (the operator enables them with "
                "--allow-uploads).",
                code="archive_mode_disabled",
            )
        try:
            super().prepare()
        except PayloadTooLarge as exc:
            raise self._too_large() from exc

    @property
    def body(self) -> bytes:
        try:
            return super().body
        except PayloadTooLarge as exc:
            raise self._too_large() from exc

    def _too_large(self) -> GatewayError:
        return archive_error(
            "archive_too_large",
            f"The upload is larger than {self.config.max_upload_bytes} bytes.",
        )

    async def post(self) -> None:
        store = self.services.uploads
        if not isinstance(store, UploadService):
            raise Forbidden("Archive uploads are disabled.", code="archive_mode_disabled")
        data = self._archive_bytes()
        if len(data) > self.config.max_upload_bytes:
            raise self._too_large()
        if not data:
            raise archive_error("archive_invalid", "The upload is empty; send a .zip or .tar.gz.")
        upload = await store.create(data, self.user.user)
        await self.send_json(upload.to_json(), 201)

    def _archive_bytes(self) -> bytes:
        content_type = self.request.headers.get("Content-Type", "")
        media = content_type.split(";")[0].strip().lower()
        if media == "multipart/form-data":
            return self._multipart_file(content_type)
        if media not in RAW_TYPES and media not in LENIENT_TYPES:
            raise UnsupportedMediaType(
                f"Send the archive as the raw body (application/zip, application/gzip or "
                f"application/octet-stream) or as one multipart/form-data file, not {media}."
            )
        return self.body

    def _multipart_file(self, content_type: str) -> bytes:
        arguments: dict[str, list[bytes]] = {}
        files: dict[str, list[HTTPFile]] = {}
        try:
            parse_body_arguments(content_type, self.body, arguments, files)
        except HTTPInputError as exc:
            raise InvalidRequest(f"The multipart body is malformed: {exc}.") from exc
        parts = [part for group in files.values() for part in group]
        if len(parts) != 1:
            raise InvalidRequest(
                f"Send exactly one file in the multipart body; it holds {len(parts)}."
            )
        return bytes(parts[0].body)
