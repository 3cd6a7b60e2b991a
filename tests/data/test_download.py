"""fetch(): mirrors in order, md5 verification, atomic placement; the folder and offline helpers.

No test touches the network: `urllib.request.urlopen` is replaced by a fake
that serves bytes (or raises) per URL.
"""

import hashlib
import http.client
import io
import urllib.error
import urllib.request

import pytest

from mlptrain.data import download
from mlptrain.data.download import fetch, md5sum, offline_error, prepare_folder
from mlptrain.errors import UserError

PAYLOAD = bytes(range(256)) * 9000  # > 2 chunks, so streaming is exercised
PAYLOAD_MD5 = hashlib.md5(PAYLOAD).hexdigest()


class FakeResponse(io.BytesIO):
    """What urlopen returns, reduced to what fetch uses: read(n), headers, a context manager."""

    def __init__(self, data, fail_after=None):
        super().__init__(data)
        self.headers = {"Content-Length": str(len(data))}
        self.fail_after = fail_after

    def read(self, size=-1):
        if self.fail_after is not None and self.tell() >= self.fail_after:
            raise http.client.IncompleteRead(b"")
        return super().read(size)


@pytest.fixture
def serve(monkeypatch):
    """serve({url: bytes | FakeResponse | Exception}); returns the list of (url, timeout) requested."""
    calls = []

    def install(routes):
        def urlopen(url, timeout=None):
            calls.append((url, timeout))
            answer = routes.get(url, urllib.error.URLError("no route to host"))
            if isinstance(answer, BaseException):
                raise answer
            return answer if isinstance(answer, FakeResponse) else FakeResponse(answer)

        monkeypatch.setattr(urllib.request, "urlopen", urlopen)
        return calls

    return install


def test_success_places_verified_file(tmp_path, serve):
    calls = serve({"https://a/f.bin": PAYLOAD})
    dest = tmp_path / "sub" / "f.bin"
    fetch(["https://a/f.bin"], dest, PAYLOAD_MD5)
    assert dest.read_bytes() == PAYLOAD
    assert [p.name for p in dest.parent.iterdir()] == ["f.bin"]  # no temporary file left
    assert calls == [("https://a/f.bin", download.TIMEOUT_S)]
    assert md5sum(dest) == PAYLOAD_MD5


def test_md5_may_be_a_set(tmp_path, serve):
    serve({"https://a/f": PAYLOAD})
    fetch(["https://a/f"], tmp_path / "f", {"0" * 32, PAYLOAD_MD5})
    assert (tmp_path / "f").read_bytes() == PAYLOAD


def test_injected_opener(tmp_path):
    fetch(["x://f"], tmp_path / "f", PAYLOAD_MD5, opener=lambda url, timeout: FakeResponse(PAYLOAD))
    assert (tmp_path / "f").read_bytes() == PAYLOAD


@pytest.mark.parametrize("first", [
    urllib.error.URLError("offline"),
    urllib.error.HTTPError("https://a/f", 404, "Not Found", {}, None),
    TimeoutError("timed out"),
    FakeResponse(b"not the file"),                 # wrong md5
    FakeResponse(PAYLOAD, fail_after=1 << 20),     # connection drops mid-stream
], ids=["url-error", "http-404", "timeout", "md5-mismatch", "dropped"])
def test_first_mirror_fails_second_succeeds(tmp_path, serve, first):
    calls = serve({"https://a/f": first, "http://b/f": PAYLOAD})
    fetch(["https://a/f", "http://b/f"], tmp_path / "f", PAYLOAD_MD5)
    assert [url for url, _ in calls] == ["https://a/f", "http://b/f"]
    assert (tmp_path / "f").read_bytes() == PAYLOAD
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_md5_mismatch_everywhere_leaves_nothing(tmp_path, serve):
    serve({"https://a/f": b"corrupt", "http://b/f": PAYLOAD[:-1]})
    with pytest.raises(UserError) as caught:
        fetch(["https://a/f", "http://b/f"], tmp_path / "f", PAYLOAD_MD5)
    message = str(caught.value)
    assert "f" in message and "md5" in message and "https://a/f" in message and "http://b/f" in message
    assert "\n" not in message
    assert list(tmp_path.iterdir()) == []


def test_all_mirrors_offline(tmp_path, serve):
    serve({})
    with pytest.raises(UserError, match=r"could not download f\.bin: https://a/f\.bin: no route to host"):
        fetch(["https://a/f.bin"], tmp_path / "f.bin", PAYLOAD_MD5)
    assert list(tmp_path.iterdir()) == []


def test_interrupt_removes_temporary_file(tmp_path, serve):
    class Interrupted(FakeResponse):
        def read(self, size=-1):
            if self.tell():
                raise KeyboardInterrupt
            return super().read(size)

    serve({"https://a/f": Interrupted(PAYLOAD)})
    with pytest.raises(KeyboardInterrupt):
        fetch(["https://a/f"], tmp_path / "f", PAYLOAD_MD5)
    assert list(tmp_path.iterdir()) == []


def test_unwritable_folder(tmp_path, serve):
    calls = serve({"https://a/f": PAYLOAD})
    (tmp_path / "a-file").write_text("")  # a folder below a regular file cannot be made, even as root
    with pytest.raises(UserError, match="cannot write .*a-file/sub/f"):
        fetch(["https://a/f"], tmp_path / "a-file" / "sub" / "f", PAYLOAD_MD5)
    assert calls == []


def test_prepare_folder_creates_parents(tmp_path):
    prepare_folder(tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b").is_dir()
    prepare_folder(tmp_path / "a" / "b")  # exists already: fine


def test_prepare_folder_below_a_file(tmp_path):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(UserError, match=r"cannot create .*a-file/mnist for the download .*MLPTRAIN_DATA_DIR"):
        prepare_folder(tmp_path / "a-file" / "mnist")


def test_offline_message_lists_files_folder_and_root(tmp_path):
    error = offline_error("MNIST", tmp_path / "mnist", UserError("could not download x: offline"),
                          [("a.gz", "https://m/a.gz"), ("b.gz", "https://m/b.gz")], "a note")
    assert error.multiline and str(error).splitlines() == [
        "MNIST could not be downloaded (could not download x: offline)",
        f"put these files into {tmp_path / 'mnist'}:",
        "  a.gz  from https://m/a.gz",
        "  b.gz  from https://m/b.gz",
        "a note",
        "or set MLPTRAIN_DATA_DIR (or data.root) to a folder that holds mnist/",
    ]


def test_offline_error_keeps_values_on_their_lines(tmp_path):
    folder = tmp_path / "evil\nerror: forged" / "mnist"
    error = offline_error("MNIST", folder, UserError("a\nb"), [("a.gz", "https://m/a\n.gz")])
    lines = str(error).splitlines()
    assert len(lines) == 4 and lines[0] == "MNIST could not be downloaded (a b)"
    assert "evil error: forged" in lines[1] and lines[2] == "  a.gz  from https://m/a .gz"
