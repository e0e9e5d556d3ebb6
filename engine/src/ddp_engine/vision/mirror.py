"""A local mirror of an IDX data set for tests: torchvision's real download path, run offline."""

import gzip
import hashlib
import http.server
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path


class MirrorHandler(http.server.SimpleHTTPRequestHandler):
    """Serves a folder; the file named by ``cut_off`` is cut off half-way, as a dropped connection
    cuts a transfer: the full Content-Length is announced, half the bytes sent, the connection closed."""

    cut_off: str | None = None

    def do_GET(self) -> None:
        if self.cut_off is None or not self.path.endswith(self.cut_off):
            return super().do_GET()
        data = (Path(self.directory) / self.cut_off).read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[: len(data) // 2])
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, *args) -> None:
        pass


@contextmanager
def local_mirror(
    raw_dir: Path, names: Sequence[str], folder: Path
) -> Iterator[tuple[str, type[MirrorHandler], list[tuple[str, str]]]]:
    """Serve the IDX files ``names`` of ``raw_dir`` over HTTP on 127.0.0.1, gzipped into ``folder``
    as the real mirrors serve them, until the block ends.

    Yields:
        The mirror's URL, its handler class (set its ``cut_off`` to cut a file's transfer off), and
        the ``(archive, MD5)`` pairs that torchvision's ``resources`` of the data set must list.
    """
    folder.mkdir(parents=True, exist_ok=True)
    resources = []
    for name in names:
        archive = folder / f"{name}.gz"
        archive.write_bytes(gzip.compress((raw_dir / name).read_bytes()))
        resources.append((archive.name, hashlib.md5(archive.read_bytes()).hexdigest()))
    handler = type("Handler", (MirrorHandler,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/", handler, resources
    finally:
        server.shutdown()
