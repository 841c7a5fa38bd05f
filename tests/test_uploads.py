"""POST /v1/uploads and runs that use an archive: every limit and hostile entry refused with
its own code (before unpacking where the archive declares it, while unpacking otherwise),
raw and multipart uploads, ownership, expiry, and archive + entrypoint runs on both
backends. Archives are built here with zipfile/tarfile, or byte by byte where those refuse.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import io
import json
import secrets
import stat
import struct
import tarfile
import time
import tracemalloc
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.api import assert_error, poll_run
from tests.conftest import BACKENDS, start_gateway
from tests.support import Client, GatewayThread, Response, serving, wait_for, write_tokens

GB = 10**9
MiB = 1024 * 1024

# --- building archives --------------------------------------------------------------


def make_zip(entries: dict[str, bytes | str], method: int = zipfile.ZIP_DEFLATED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", method) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def zip_with(info: zipfile.ZipInfo, data: bytes = b"x") -> bytes:
    """A zip of one entry described by `info` (zipfile writes any name and mode given)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(info, data)
    return buffer.getvalue()


def zip_entry(name: str, mode: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.create_system = 3  # unix: the high 16 bits of external_attr are st_mode
    info.external_attr = mode << 16
    return info


def make_tgz(
    members: list[tuple[tarfile.TarInfo, bytes | None]], fmt: int = tarfile.PAX_FORMAT
) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=fmt) as archive:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            archive.addfile(info, None if data is None else io.BytesIO(data))
    return buffer.getvalue()


def tar_file(name: str, data: bytes | str) -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data.encode() if isinstance(data, str) else data


def tar_special(name: str, kind: bytes, link: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info, None


def tgz_of(files: dict[str, bytes | str]) -> bytes:
    return make_tgz([tar_file(name, data) for name, data in files.items()])


def tar_block(name: bytes, size: int, kind: bytes) -> bytes:
    """One ustar header block, written by hand (for headers tarfile will not write)."""
    header = bytearray(512)
    header[0 : len(name)] = name
    header[100:108] = b"0000644\x00"
    header[108:116] = header[116:124] = b"0000000\x00"
    header[124:136] = b"%011o\x00" % size
    header[136:148] = b"00000000000\x00"
    header[148:156] = b" " * 8
    header[156:157] = kind
    header[257:265] = b"ustar\x0000"
    header[148:156] = b"%06o\x00 " % sum(header)
    return bytes(header)


def craft_zip(name: str, payload: bytes, claimed_size: int, compressed: bool = True) -> bytes:
    """A one-entry zip written byte by byte, declaring `claimed_size` unpacked bytes (with a
    zip64 extra field when it does not fit 32 bits) whatever `payload` really holds."""
    raw_name = name.encode()
    zip64 = claimed_size >= 0xFFFFFFFF
    extra = struct.pack("<HHQ", 1, 8, claimed_size) if zip64 else b""
    size32 = 0xFFFFFFFF if zip64 else claimed_size
    method = zipfile.ZIP_DEFLATED if compressed else zipfile.ZIP_STORED
    version = 45 if zip64 else 20
    # flags, method, time, date, CRC, sizes (stored, claimed), lengths of name and extra:
    # the same in the entry's local header and in the central directory
    entry = (0, method, 0, 0x21, 0, len(payload), size32, len(raw_name), len(extra))
    local = struct.pack("<4s2B4HL2L2H", b"PK\x03\x04", version, 0, *entry)
    central = struct.pack(
        "<4s4B4HL2L5H2L", b"PK\x01\x02", version, 3, version, 0, *entry, 0, 0, 0, 0o100644 << 16, 0
    )
    body = local + raw_name + extra + payload
    directory = central + raw_name + extra
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 1, 1, len(directory), len(body), 0)
    return body + directory + end


def deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    return compressor.compress(data) + compressor.flush()


def multipart(
    files: list[tuple[str, bytes]], fields: dict[str, str] | None = None
) -> tuple[bytes, dict[str, str]]:
    boundary = "gwtest" + secrets.token_hex(8)
    body = b""
    for key, value in (fields or {}).items():
        body += (
            f'--{boundary}\r\nContent-Disposition: form-data; name="{key}"\r\n\r\n{value}\r\n'
        ).encode()
    for filename, data in files:
        body += (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
            f'filename="{filename}"\r\nContent-Type: application/octet-stream\r\n\r\n'
        ).encode()
        body += data + b"\r\n"
    body += f"--{boundary}--\r\n".encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


# --- talking to the gateway ---------------------------------------------------------


def upload(client: Client, data: bytes, content_type: str = "application/zip") -> Response:
    return client.request("POST", "/v1/uploads", raw=data, headers={"Content-Type": content_type})


def upload_id(client: Client, data: bytes) -> str:
    response = upload(client, data)
    assert response.status == 201, response.body
    return str(response.json()["id"])


def stored(server: GatewayThread) -> list[str]:
    folder = server.settings.data_dir / "uploads"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


@dataclasses.dataclass
class Cost:
    seconds: float = 0.0
    peak_bytes: int = 0


@contextlib.contextmanager
def measured() -> Iterator[Cost]:
    """Time and peak Python memory (all threads, so the gateway's too) of the block."""
    cost = Cost()
    tracemalloc.start()
    started = time.monotonic()
    try:
        yield cost
    finally:
        cost.seconds = time.monotonic() - started
        cost.peak_bytes = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


# --- gateways ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def roomy() -> Iterator[GatewayThread]:
    """Uploads enabled with the default limits (local backend: no kernel is started)."""
    yield from serving(start_gateway("local", allow_uploads=True))


@pytest.fixture(scope="module")
def strict() -> Iterator[GatewayThread]:
    """Uploads enabled with tiny limits, so that each one is easy to pass."""
    server = start_gateway(
        "local",
        allow_uploads=True,
        max_upload_bytes=128 * 1024,
        max_unpacked_bytes=10_000,
        max_archive_entries=10,
        max_archive_file_bytes=4096,
    )
    yield from serving(server)


@pytest.fixture(scope="module", params=BACKENDS)
def runner(request: pytest.FixtureRequest) -> Iterator[GatewayThread]:
    """Uploads enabled, on each backend, for runs that use an archive."""
    yield from serving(start_gateway(str(request.param), allow_uploads=True))


# --- uploading -----------------------------------------------------------------------


def test_uploads_are_off_unless_the_operator_enables_them() -> None:
    server = start_gateway("local")
    try:
        client = server.client()
        response = upload(client, make_zip({"a.txt": "a"}))
        assert_error(response, 403, "archive_mode_disabled", "--allow-uploads")
        response = client.request(
            "POST", "/v1/runs", {"code": "print(1)", "archive": "upl_" + "0" * 32}
        )
        assert_error(response, 403, "archive_mode_disabled")
        assert stored(server) == []
    finally:
        server.stop()


def test_raw_zip_upload_answers_its_id_entries_and_unpacked_bytes(roomy: GatewayThread) -> None:
    data = make_zip({"main.py": "print('hi')\n", "pkg/": "", "pkg/data.txt": "x" * 1000})
    response = upload(roomy.client(), data)
    assert response.status == 201, response.body
    answer = response.json()
    assert set(answer) == {"id", "entries", "unpacked_bytes"}
    assert answer["id"].startswith("upl_") and len(answer["id"]) == 36
    assert answer["entries"] == 3
    assert answer["unpacked_bytes"] == len("print('hi')\n") + 1000
    assert f"{answer['id']}.archive" in stored(roomy)


@pytest.mark.parametrize(
    "content_type",
    [
        "application/gzip",
        "application/x-gzip",
        "application/x-tar+gzip",
        "application/octet-stream",
        "application/zip",  # the format comes from the magic bytes, not the label
    ],
)
def test_raw_tar_gz_upload_with_any_archive_media_type(
    roomy: GatewayThread, content_type: str
) -> None:
    data = tgz_of({"run.sh": "echo hi\n", "lib/util.sh": "x=1\n"})
    response = upload(roomy.client(), data, content_type)
    assert response.status == 201, response.body
    assert response.json()["entries"] == 2
    assert response.json()["unpacked_bytes"] == len("echo hi\n") + len("x=1\n")


def test_multipart_upload_with_one_file_field(roomy: GatewayThread) -> None:
    body, headers = multipart([("code.zip", make_zip({"a.py": "1", "b.py": "22"}))], {"x": "y"})
    response = roomy.client().request("POST", "/v1/uploads", raw=body, headers=headers)
    assert response.status == 201, response.body
    assert response.json()["entries"] == 2 and response.json()["unpacked_bytes"] == 3


def test_multipart_needs_exactly_one_well_formed_file(roomy: GatewayThread) -> None:
    client = roomy.client()
    archive = make_zip({"a.py": "1"})
    body, headers = multipart([("a.zip", archive), ("b.zip", archive)])
    response = client.request("POST", "/v1/uploads", raw=body, headers=headers)
    assert_error(response, 400, "invalid_request", "exactly one file")
    body, headers = multipart([])
    response = client.request("POST", "/v1/uploads", raw=body, headers=headers)
    assert_error(response, 400, "invalid_request", "exactly one file")
    response = client.request("POST", "/v1/uploads", raw=b"no boundary here", headers=headers)
    assert_error(response, 400, "invalid_request", "multipart")


def test_other_media_types_are_refused(roomy: GatewayThread) -> None:
    response = upload(roomy.client(), make_zip({"a.py": "1"}), "text/plain")
    assert_error(response, 415, "unsupported_media_type", "text/plain")


@pytest.mark.parametrize(
    ("data", "mention"),
    [
        (b"", "empty"),
        (b"just some text, not an archive", ".zip"),
        (zlib.compress(b"zlib is not gzip"), ".zip"),
        (b"\x1f\x8b\x08" + b"\x00" * 40, "gzip"),
    ],
    ids=["empty", "text", "zlib", "broken-gzip"],
)
def test_unknown_or_corrupt_uploads_are_archive_invalid(
    roomy: GatewayThread, data: bytes, mention: str
) -> None:
    before = stored(roomy)
    assert_error(upload(roomy.client(), data), 400, "archive_invalid", mention)
    assert stored(roomy) == before


def test_damaged_archives_are_archive_invalid(roomy: GatewayThread) -> None:
    client = roomy.client()
    good_zip = make_zip({"a.txt": "hello world " * 50})
    assert_error(upload(client, good_zip[:-30]), 400, "archive_invalid")  # end record cut
    flipped = bytearray(good_zip)
    flipped[40] ^= 0xFF  # inside the compressed data: CRC or inflate fails
    assert_error(upload(client, bytes(flipped)), 400, "archive_invalid", "'a.txt'")
    good_tgz = tgz_of({"a.txt": secrets.token_bytes(5000)})
    assert_error(upload(client, good_tgz[: len(good_tgz) // 2]), 400, "archive_invalid")
    not_tar = gzip.compress(b"this is a gzip of plain text " * 40)
    assert_error(upload(client, not_tar), 400, "archive_invalid", "tar")
    encrypted = bytearray(make_zip({"secret.txt": "x"}))
    # set the "encrypted" flag bit in the local header and in the central directory entry
    encrypted[6] |= 1
    central = encrypted.find(b"PK\x01\x02")
    encrypted[central + 8] |= 1
    assert_error(upload(client, bytes(encrypted)), 400, "archive_invalid", "encrypted")
    bzip = make_zip({"b.txt": "b" * 100}, zipfile.ZIP_BZIP2)
    assert_error(upload(client, bzip), 400, "archive_invalid", "method")


# --- hostile entries -----------------------------------------------------------------


HOSTILE: list[tuple[str, Callable[[], bytes], str, str]] = [
    (
        "zip-absolute",
        lambda: make_zip({"/etc/cron.d/evil": "x"}),
        "archive_absolute_path",
        "/etc/cron.d/evil",
    ),
    (
        "zip-drive",
        lambda: make_zip({"C:\\Windows\\evil.txt": "x"}),
        "archive_absolute_path",
        "evil.txt",
    ),
    (
        "zip-dotdot",
        lambda: make_zip({"a/../../evil.txt": "x"}),
        "archive_path_traversal",
        "a/../../evil.txt",
    ),
    (
        "zip-backslash-dotdot",
        lambda: make_zip({"..\\..\\evil.txt": "x"}),
        "archive_path_traversal",
        "evil.txt",
    ),
    (
        "zip-symlink",
        lambda: zip_with(zip_entry("link", stat.S_IFLNK | 0o777), b"/etc/passwd"),
        "archive_link",
        "'link'",
    ),
    (
        "zip-fifo",
        lambda: zip_with(zip_entry("pipe", stat.S_IFIFO | 0o644), b""),
        "archive_special_file",
        "'pipe'",
    ),
    (
        "zip-chardev",
        lambda: zip_with(zip_entry("null", stat.S_IFCHR | 0o666), b""),
        "archive_special_file",
        "'null'",
    ),
    (
        "tar-absolute",
        lambda: make_tgz([tar_file("/tmp/evil.txt", "x")]),
        "archive_absolute_path",
        "/tmp/evil.txt",
    ),
    (
        "tar-dotdot",
        lambda: make_tgz([tar_file("../evil.txt", "x")]),
        "archive_path_traversal",
        "../evil.txt",
    ),
    (
        "tar-deep-dotdot",
        lambda: make_tgz([tar_file("ok/./../../../evil", "x")]),
        "archive_path_traversal",
        "evil",
    ),
    (
        "tar-symlink",
        lambda: make_tgz([tar_special("link", tarfile.SYMTYPE, "/etc/passwd")]),
        "archive_link",
        "/etc/passwd",
    ),
    (
        "tar-hardlink",
        lambda: make_tgz([tar_file("a.txt", "a"), tar_special("b.txt", tarfile.LNKTYPE, "a.txt")]),
        "archive_link",
        "'b.txt'",
    ),
    (
        "tar-chardev",
        lambda: make_tgz([tar_special("dev/null", tarfile.CHRTYPE)]),
        "archive_special_file",
        "'dev/null'",
    ),
    (
        "tar-blockdev",
        lambda: make_tgz([tar_special("sda", tarfile.BLKTYPE)]),
        "archive_special_file",
        "'sda'",
    ),
    (
        "tar-fifo",
        lambda: make_tgz([tar_special("fifo", tarfile.FIFOTYPE)]),
        "archive_special_file",
        "'fifo'",
    ),
    (
        "tar-link-then-write-through-it",
        lambda: make_tgz(
            [tar_special("out", tarfile.SYMTYPE, "/etc"), tar_file("out/passwd", "x")]
        ),
        "archive_link",
        "'out'",
    ),
    (
        "tar-gnu-longname-dotdot",
        lambda: make_tgz([tar_file("../" + "d" * 150, "x")], tarfile.GNU_FORMAT),
        "archive_path_traversal",
        "ddd",
    ),
]


@pytest.mark.parametrize(
    ("build", "code", "mention"),
    [case[1:] for case in HOSTILE],
    ids=[case[0] for case in HOSTILE],
)
def test_hostile_entries_are_refused_with_their_code(
    roomy: GatewayThread, build: Callable[[], bytes], code: str, mention: str
) -> None:
    before = stored(roomy)
    assert_error(upload(roomy.client(), build()), 400, code, mention)
    assert stored(roomy) == before


def test_a_file_where_a_folder_is_is_refused(roomy: GatewayThread) -> None:
    data = make_tgz([tar_file("a", "file"), tar_file("a/b.txt", "inside a file")])
    assert_error(upload(roomy.client(), data), 400, "archive_invalid", "'a/b.txt'")


# --- limits --------------------------------------------------------------------------


def test_upload_size_limit_raw_and_multipart(strict: GatewayThread) -> None:
    client = strict.client()
    big = make_zip({"noise.bin": secrets.token_bytes(200 * 1024)}, zipfile.ZIP_STORED)
    assert_error(upload(client, big), 413, "archive_too_large", str(128 * 1024))
    body, headers = multipart([("big.zip", big)])
    response = client.request("POST", "/v1/uploads", raw=body, headers=headers)
    assert_error(response, 413, "archive_too_large")
    # within the framing slack but over the limit once the file is taken out
    near = secrets.token_bytes(128 * 1024 + 10)
    body, headers = multipart([("near.zip", near)])
    response = client.request("POST", "/v1/uploads", raw=body, headers=headers)
    assert_error(response, 413, "archive_too_large")


@pytest.mark.parametrize("kind", ["zip", "tgz"])
def test_entry_count_limit(strict: GatewayThread, kind: str) -> None:
    files: dict[str, bytes | str] = {f"f{i}.txt": "x" for i in range(11)}
    data = make_zip(files) if kind == "zip" else tgz_of(files)
    assert_error(upload(strict.client(), data), 413, "archive_too_many_entries", "10")
    folders = make_zip({f"d{i}/": "" for i in range(11)})
    assert_error(upload(strict.client(), folders), 413, "archive_too_many_entries")
    ten: dict[str, bytes | str] = {f"f{i}.txt": "x" for i in range(10)}
    assert upload(strict.client(), make_zip(ten)).status == 201


def test_default_entry_count_limit_is_20000(roomy: GatewayThread) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        for index in range(20_001):
            archive.writestr(f"{index}", b"")
    with measured() as cost:
        response = upload(roomy.client(), buffer.getvalue())
    assert_error(response, 413, "archive_too_many_entries", "20000")
    assert cost.peak_bytes < 10 * MiB, cost  # counted before zipfile builds 20,001 objects


@pytest.mark.parametrize("kind", ["zip", "tgz"])
def test_single_file_limit(strict: GatewayThread, kind: str) -> None:
    files: dict[str, bytes | str] = {"small.txt": "s", "big.bin": secrets.token_bytes(5000)}
    data = make_zip(files) if kind == "zip" else tgz_of(files)
    assert_error(upload(strict.client(), data), 413, "archive_entry_too_large", "'big.bin'", "4096")


@pytest.mark.parametrize("kind", ["zip", "tgz"])
def test_total_unpacked_limit(strict: GatewayThread, kind: str) -> None:
    files: dict[str, bytes | str] = {f"part{i}.bin": secrets.token_bytes(3000) for i in range(4)}
    data = make_zip(files) if kind == "zip" else tgz_of(files)
    assert_error(upload(strict.client(), data), 413, "archive_unpacked_too_large", "10000", "part3")


def test_a_real_high_ratio_zip_is_refused_before_unpacking(roomy: GatewayThread) -> None:
    data = make_zip({"zeros.bin": bytes(50_000_000)})  # 50 MB of zeros in ~50 KB
    assert len(data) < 100_000
    with measured() as cost:
        response = upload(roomy.client(), data)
    assert_error(response, 413, "archive_ratio_exceeded", "'zeros.bin'", "100:1")
    assert cost.peak_bytes < 8 * MiB, cost  # refused before unpacking: no 50 MB was made


def test_a_real_high_ratio_tar_gz_is_refused_while_streaming(roomy: GatewayThread) -> None:
    data = tgz_of({"zeros.bin": bytes(50_000_000)})
    with measured() as cost:
        response = upload(roomy.client(), data)
    assert_error(response, 413, "archive_ratio_exceeded", "'zeros.bin'")
    assert cost.peak_bytes < 8 * MiB, cost  # refused before unpacking: no 50 MB was made


def test_small_compressible_files_are_not_ratio_checked(roomy: GatewayThread) -> None:
    data = make_zip({f"zeros{i}.bin": bytes(1_000_000) for i in range(3)})
    response = upload(roomy.client(), data)
    assert response.status == 201, response.body
    assert response.json()["unpacked_bytes"] == 3_000_000


def test_zip_bomb_claiming_10_gb_is_refused_without_unpacking(roomy: GatewayThread) -> None:
    bomb = craft_zip("bomb.bin", deflate(bytes(4 * MiB)), claimed_size=10 * GB)
    assert zipfile.ZipFile(io.BytesIO(bomb)).infolist()[0].file_size == 10 * GB
    with measured() as cost:
        response = upload(roomy.client(), bomb)
    assert_error(response, 413, "archive_entry_too_large", "'bomb.bin'", str(10 * GB))
    assert cost.peak_bytes < 8 * MiB, cost  # refused before unpacking: no 50 MB was made


def test_zip_claiming_little_but_holding_more_is_cut_at_its_claim(roomy: GatewayThread) -> None:
    # The central directory says 1000 bytes; the deflate stream holds 5 MB of zeros. Reading
    # stops at the declared size, the CRC then fails: refused, and nothing near 5 MB is made.
    liar = craft_zip("liar.bin", deflate(bytes(5_000_000)), claimed_size=1000)
    with measured() as cost:
        response = upload(roomy.client(), liar)
    assert_error(response, 400, "archive_invalid", "'liar.bin'")
    assert cost.peak_bytes < 4 * MiB, cost


def test_tar_gz_claiming_10_gb_is_refused_at_its_header(roomy: GatewayThread) -> None:
    for fmt in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):  # base-256 size, pax size record
        info = tarfile.TarInfo("bomb.bin")
        info.size = 10 * GB
        with measured() as cost:
            response = upload(roomy.client(), make_tgz([(info, None)], fmt))
        assert_error(response, 413, "archive_entry_too_large", "'bomb.bin'")
        assert cost.peak_bytes < 4 * MiB, cost


def pax_record(key: str, value: bytes) -> bytes:
    body = b" " + key.encode() + b"=" + value + b"\n"
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length += 1
    return str(length).encode() + body


def test_tar_gz_stream_is_bounded_even_without_entries(strict: GatewayThread) -> None:
    # Global pax headers are no entries and hold no file, but they still decompress: the
    # walk of the headers stops once the stream passes its bound.
    payload = pax_record("comment", b"x" * 60_000)
    member = tar_block(b"pax_global_header", len(payload), b"g") + payload
    member += bytes(-len(member) % 512)
    data = gzip.compress(member * 40 + bytes(1024))
    assert len(data) < 128 * 1024
    assert_error(upload(strict.client(), data), 413, "archive_unpacked_too_large")


def test_oversized_extended_headers_are_refused(roomy: GatewayThread) -> None:
    size = 1_000_000
    data = gzip.compress(tar_block(b"././@PaxHeader", size, b"x") + bytes(size + 1024))
    assert_error(upload(roomy.client(), data), 400, "archive_invalid", "extended header")


# --- runs with an archive ------------------------------------------------------------


PYTHON_PROJECT: dict[str, bytes | str] = {
    "main.py": (
        "import json\n"
        "from pkg.helper import greet\n"
        "print(greet(open('data/name.txt').read().strip()), __name__)\n"
        "result = json.load(open('data/config.json'))\n"
    ),
    "pkg/__init__.py": "",
    "pkg/helper.py": "def greet(name):\n    return f'hello {name}'\n",
    "data/name.txt": "archive\n",
    "data/config.json": '{"source": "archive"}',
}

BASH_PROJECT: dict[str, bytes | str] = {
    "run.sh": 'source lib/util.sh\nshout "$(cat data/msg.txt)"\nexit 3\n',
    "lib/util.sh": 'shout() { echo "${1^^}"; echo oops >&2; }\n',
    "data/msg.txt": "from the archive\n",
}


def test_python_run_with_a_zip_archive_and_an_entrypoint(runner: GatewayThread) -> None:
    client = runner.client()
    archive = upload_id(client, make_zip(PYTHON_PROJECT))
    record = client.run(archive=archive, entrypoint="main.py", return_files=["data/name.txt"])
    assert record["status"] == "succeeded", record
    assert record["stdout"] == "hello archive __main__\n"
    assert record["result"] == {"source": "archive"}
    assert record["files"][0]["content"] == "archive\n"
    # the same archive serves any number of runs
    again = client.run(archive=archive, code="import os; print(sorted(os.listdir('pkg')))")
    assert "helper.py" in again["stdout"], again


def test_bash_run_with_a_tar_gz_archive_and_an_entrypoint(runner: GatewayThread) -> None:
    client = runner.client()
    archive = upload_id(client, tgz_of(BASH_PROJECT))
    record = client.run(language="bash", archive=archive, entrypoint="run.sh")
    assert record["status"] == "failed" and record["exit_code"] == 3, record
    assert record["stdout"] == "FROM THE ARCHIVE\n"
    assert record["stderr"] == "oops\n"


def test_files_replace_archive_entries_of_the_same_path(runner: GatewayThread) -> None:
    client = runner.client()
    archive = upload_id(client, make_zip(PYTHON_PROJECT))
    record = client.run(
        archive=archive,
        entrypoint="main.py",
        files=[
            {"path": "data/name.txt", "content": "files\n"},
            {"path": "extra/new.txt", "content": "new"},
        ],
        return_files=["data/name.txt", "data/config.json", "extra/new.txt"],
    )
    assert record["status"] == "succeeded", record
    assert record["stdout"] == "hello files __main__\n"
    contents = {f["path"]: f["content"] for f in record["files"]}
    assert contents == {
        "data/name.txt": "files\n",
        "data/config.json": '{"source": "archive"}',
        "extra/new.txt": "new",
    }


def test_background_run_with_an_archive(runner: GatewayThread) -> None:
    client = runner.client()
    archive = upload_id(client, tgz_of(BASH_PROJECT))
    response = client.request(
        "POST",
        "/v1/runs",
        {"language": "bash", "archive": archive, "code": "cat data/msg.txt", "background": True},
    )
    assert response.status == 202, response.body
    record = poll_run(client, response.json()["id"])
    assert record["status"] == "succeeded" and record["stdout"] == "from the archive\n", record


def test_a_missing_python_entrypoint_fails_the_run_and_says_so(runner: GatewayThread) -> None:
    client = runner.client()
    archive = upload_id(client, make_zip(PYTHON_PROJECT))
    record = client.run(archive=archive, entrypoint="mian.py")
    assert record["status"] == "failed" and record["exit_code"] != 0, record
    assert any("mian.py" in note and "archive" in note for note in record["notes"]), record
    assert "mian.py" in json.dumps(record["error"]) + record["stderr"], record


def test_a_missing_bash_entrypoint_fails_the_run_and_says_so(runner: GatewayThread) -> None:
    client = runner.client()
    archive = upload_id(client, tgz_of(BASH_PROJECT))
    record = client.run(language="bash", archive=archive, entrypoint="lib/missing.sh")
    assert record["status"] == "failed" and record["exit_code"] == 127, record
    assert any("lib/missing.sh" in note for note in record["notes"]), record
    assert "lib/missing.sh" in record["stderr"]


def test_an_unknown_archive_id_is_404_on_the_archive_field(roomy: GatewayThread) -> None:
    client = roomy.client()
    for archive in ("upl_" + "0" * 32, "not-an-id", "../../etc/passwd"):
        response = client.request("POST", "/v1/runs", {"code": "print(1)", "archive": archive})
        error = assert_error(response, 404, "not_found")
        assert error["field"] == "archive"


def test_files_may_not_turn_an_archive_folder_into_a_file(roomy: GatewayThread) -> None:
    client = roomy.client()
    archive = upload_id(client, make_zip(PYTHON_PROJECT))
    response = client.request(
        "POST",
        "/v1/runs",
        {"code": "print(1)", "archive": archive, "files": [{"path": "pkg", "content": "x"}]},
    )
    error = assert_error(response, 400, "invalid_path", "pkg")
    assert error["field"] == "files"


def test_empty_folders_of_the_archive_are_noted(roomy: GatewayThread) -> None:
    client = roomy.client()
    archive = upload_id(client, make_zip({"a.py": "print(1)", "out/": "", "src/": "", "src/b": ""}))
    record = client.run(archive=archive, entrypoint="a.py")
    assert record["status"] == "succeeded", record
    assert any("1 empty folder" in note and "out" in note for note in record["notes"]), record


def test_an_upload_belongs_to_its_user(roomy: GatewayThread, tmp_path: Path) -> None:
    tokens = {
        "alice-token-0123456789": {"user": "alice", "role": "user"},
        "bob-token-0123456789ab": {"user": "bob", "role": "user"},
        "root-token-0123456789a": {"user": "root", "role": "admin"},
    }
    token_file = write_tokens(tmp_path, {t: (u["user"], u["role"]) for t, u in tokens.items()})
    server = start_gateway("local", tokens=token_file, allow_uploads=True)
    try:
        alice = server.client("alice-token-0123456789")
        anonymous = server.client()
        assert_error(upload(anonymous, make_zip({"a.py": "1"})), 401, "unauthorized")
        archive = upload_id(alice, make_zip({"a.py": "print('mine')"}))
        for token in ("bob-token-0123456789ab", "root-token-0123456789a"):
            response = server.client(token).request(
                "POST", "/v1/runs", {"archive": archive, "entrypoint": "a.py"}
            )
            error = assert_error(response, 404, "not_found")
            assert error["field"] == "archive"
        record = alice.run(archive=archive, entrypoint="a.py")
        assert record["stdout"] == "mine\n", record
    finally:
        server.stop()


def test_uploads_expire_after_their_ttl() -> None:
    server = start_gateway("local", allow_uploads=True, upload_ttl=1.0)
    try:
        client = server.client()
        archive = upload_id(client, make_zip({"a.py": "print(1)"}))
        assert len(stored(server)) == 2  # the archive and its metadata
        body = {"archive": archive, "entrypoint": "a.py"}
        assert wait_for(lambda: client.request("POST", "/v1/runs", body).status == 404)
        response = client.request("POST", "/v1/runs", body)
        assert_error(response, 404, "not_found", "expire")
        assert stored(server) == []  # swept
    finally:
        server.stop()


def test_uploads_are_private_files(roomy: GatewayThread) -> None:
    archive = upload_id(roomy.client(), make_zip({"a.py": "1"}))
    folder = roomy.settings.data_dir / "uploads"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for suffix in (".archive", ".json"):
        assert stat.S_IMODE((folder / f"{archive}{suffix}").stat().st_mode) == 0o600
