"""Files in and out of a workspace through the API, against daphne and a real worker: streamed a chunk at a
time through the worker that serves the machine, inside the paths the machine allows (checked again there with
links followed), as the machine's own user, audited in the machine's history."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tarfile
import uuid

import httpx
import pytest
from tether_client import Client, Problem

from api.tokens import create_token
from executions.actions import Actor, set_file_roots, set_machine_state
from executions.models import MachineEvent, MachineState
from files.protocol import chunk_bytes
from tests.bridge.harness import Stack
from tests.factories import grant

pytestmark = [pytest.mark.bridge, pytest.mark.django_db(transaction=True)]

MiB = 1024 * 1024


def _token(user, *scopes: str) -> str:
    return create_token(user, name=f"files-{uuid.uuid4().hex[:8]}", scopes=list(scopes or ("read", "run")))[1]


def _http(stack: Stack, user, *scopes: str) -> httpx.Client:
    base = f"http://127.0.0.1:{stack.ports[0]}/api/v1"
    return httpx.Client(base_url=base, headers={"Authorization": f"Bearer {_token(user, *scopes)}"}, timeout=120)


def _put(client: httpx.Client, machine: str, path: str, data: bytes, kind: str = "application/octet-stream"):
    return client.put(f"/machines/{machine}/files/content", params={"path": path}, content=data,
                      headers={"Content-Type": kind})  # fmt: skip


def _tar(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_a_host_machine_s_files_go_in_and_out_whole_and_only_where_it_allows(place, operator, bob, tmp_path):
    stack = Stack()
    stack.extra_env |= {"TETHER_FILE_MAX_BYTES": str(4 * MiB)}
    stack.start("local")
    try:
        machine = place("local", "files-box")
        inside, outside = tmp_path / "work", tmp_path / "secret"
        inside.mkdir(), outside.mkdir()
        (outside / "key").write_text("not for you")
        (inside / "escape").symlink_to(outside)
        set_file_roots(machine, [str(inside)], actor=Actor.command("tests"))
        data = os.urandom(3 * MiB + 12345)  # 4 chunks, the last a short one
        with _http(stack, operator) as client:
            put = _put(client, "files-box", f"{inside}/sub/blob.bin", data)
            assert put.status_code == 404 and put.json()["code"] == "not_found", put.text  # no sub/ there
            put = _put(client, "files-box", f"{inside}/blob.bin", data)
            assert put.status_code == 201, put.text
            assert put.json() == {"path": f"{inside}/blob.bin", "size": len(data),
                                  "sha256": hashlib.sha256(data).hexdigest(), "tar": False}  # fmt: skip
            assert (inside / "blob.bin").read_bytes() == data
            assert not [p.name for p in inside.iterdir() if "tether-upload" in p.name]  # moved into place

            got = client.get("/machines/files-box/files/content", params={"path": f"{inside}/blob.bin"})
            assert got.status_code == 200 and got.headers["content-length"] == str(len(data))
            assert got.content == data

            listed = client.get("/machines/files-box/files", params={"path": str(inside)})
            assert listed.status_code == 200, listed.text
            entries = {e["name"]: e for e in listed.json()["entries"]}
            assert entries["blob.bin"]["type"] == "file" and entries["blob.bin"]["size"] == len(data)
            assert entries["escape"]["type"] == "link"

            # A tar, extracted into a directory it makes.
            put = _put(client, "files-box", f"{inside}/tree", _tar({"a.txt": b"alpha\n", "d/b.txt": b"beta\n"}),
                       kind="application/x-tar")  # fmt: skip
            assert put.status_code == 201 and put.json()["tar"] is True, put.text
            assert (inside / "tree" / "d" / "b.txt").read_bytes() == b"beta\n"
            put = _put(client, "files-box", str(inside), _tar({"top.txt": b"top\n"}), kind="application/x-tar")
            assert put.status_code == 201, put.text  # into an allowed path itself
            assert (inside / "top.txt").read_bytes() == b"top\n"

            # Refused: outside the allowed paths as written, through a link that leads outside, a directory as
            # a file, nothing there, a body that is not a file's type, one over the limit.
            for path in (f"{outside}/key", "/etc/passwd", f"{inside}/../secret/key"):
                got = client.get("/machines/files-box/files/content", params={"path": path})
                assert (got.status_code, got.json()["code"]) == (403, "path_refused"), path
            got = client.get("/machines/files-box/files/content", params={"path": f"{inside}/escape/key"})
            assert (got.status_code, got.json()["code"]) == (403, "path_refused")
            assert "outside the paths" in got.json()["detail"]
            put = _put(client, "files-box", f"{inside}/escape/planted", b"x")
            assert (put.status_code, put.json()["code"]) == (403, "path_refused")
            put = _put(client, "files-box", f"{inside}/escape", _tar({"planted": b"x"}), kind="application/x-tar")
            assert (put.status_code, put.json()["code"]) == (403, "path_refused")  # a tar through the link
            assert list(outside.iterdir()) == [outside / "key"]
            assert str(outside) not in put.text  # where the link leads is not said
            got = client.get("/machines/files-box/files/content", params={"path": str(inside)})
            assert (got.status_code, got.json()["code"]) == (409, "wrong_kind")
            got = client.get("/machines/files-box/files/content", params={"path": f"{inside}/nothing"})
            assert (got.status_code, got.json()["code"]) == (404, "not_found")
            put = _put(client, "files-box", f"{inside}/x.json", b"{}", kind="application/json")
            assert (put.status_code, put.json()["code"]) == (415, "unsupported_media_type")
            put = _put(client, "files-box", f"{inside}/big", b"\0" * (4 * MiB + 1))
            assert (put.status_code, put.json()["code"]) == (413, "too_large")
            assert not (inside / "big").exists()

        with _http(stack, operator, "read") as reader:
            put = _put(reader, "files-box", f"{inside}/nope", b"x")
            assert (put.status_code, put.json()["code"]) == (403, "insufficient_scope")
        with _http(stack, bob) as stranger:  # no grant: the machine does not exist for them
            got = stranger.get("/machines/files-box/files/content", params={"path": f"{inside}/blob.bin"})
            assert (got.status_code, got.json()["code"]) == (404, "not_found")
            assert str(inside) not in got.text

        events = MachineEvent.objects.filter(machine=machine).exclude(kind="state")
        said = [(e.kind, e.detail.get("path"), e.user_id) for e in events.order_by("at", "id")]
        assert said == [("file.uploaded", f"{inside}/blob.bin", operator.pk),
                        ("file.downloaded", f"{inside}/blob.bin", operator.pk),
                        ("file.uploaded", f"{inside}/tree", operator.pk),
                        ("file.uploaded", str(inside), operator.pk)]  # fmt: skip
        assert events.order_by("at", "id").first().detail["sha256"] == hashlib.sha256(data).hexdigest()

        # The Python client: a file object up, a file object down, a listing.
        with Client(f"http://127.0.0.1:{stack.ports[0]}", _token(operator, "read", "run")) as client:
            sent = client.upload("files-box", f"{inside}/from-client.bin", io.BytesIO(data))
            assert (sent["size"], sent["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())
            received = io.BytesIO()
            assert client.download("files-box", f"{inside}/from-client.bin", received) == len(data)
            assert received.getvalue() == data
            assert "from-client.bin" in {e["name"] for e in client.list_files("files-box", str(inside))["entries"]}
            with pytest.raises(Problem) as refused:
                client.download("files-box", "/etc/passwd", io.BytesIO())
            assert refused.value.code == "path_refused"
            assert client.upload("files-box", f"{inside}/empty", b"")["size"] == 0
            assert (inside / "empty").read_bytes() == b""
            exact = os.urandom(2 * chunk_bytes())  # a whole number of chunks
            client.upload("files-box", f"{inside}/exact", exact)
            received = io.BytesIO()
            assert client.download("files-box", f"{inside}/exact", received) == len(exact)
            assert received.getvalue() == exact

            set_machine_state(machine, MachineState.STOPPED, actor=Actor.command("tests"))
            with pytest.raises(Problem) as stopped:
                client.list_files("files-box", str(inside))
            assert (stopped.value.status, stopped.value.code) == (409, "state_conflict")
    finally:
        stack.stop()


def test_a_container_s_files_are_moved_as_its_own_user(stack, place, alice, container):
    machine = place("docker", "files-docker")
    grant(alice, machine, "use")
    set_file_roots(machine, ["/tmp"], actor=Actor.command("tests"))
    data = os.urandom(600 * 1024)
    with _http(stack, alice) as client:
        put = _put(client, "files-docker", "/tmp/upload.bin", data)
        assert put.status_code == 201, put.text
        assert put.json()["sha256"] == hashlib.sha256(data).hexdigest()
        seen = subprocess.run(["docker", "exec", container, "sha256sum", "/tmp/upload.bin"], capture_output=True)
        assert seen.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()
        got = client.get("/machines/files-docker/files/content", params={"path": "/tmp/upload.bin"})
        assert got.status_code == 200 and got.content == data
        listed = client.get("/machines/files-docker/files", params={"path": "/tmp"}).json()
        assert {"upload.bin"} <= {e["name"] for e in listed["entries"]}
        put = _put(client, "files-docker", "/tmp/t", _tar({"x/y.txt": b"why\n"}), kind="application/x-tar")
        assert put.status_code == 201, put.text
        seen = subprocess.run(["docker", "exec", container, "cat", "/tmp/t/x/y.txt"], capture_output=True)
        assert seen.stdout == b"why\n"
        got = client.get("/machines/files-docker/files/content", params={"path": "/etc/hostname"})
        assert (got.status_code, got.json()["code"]) == (403, "path_refused")
