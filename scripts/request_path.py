"""The path one request takes through the daemon's own code: the files it goes through, and how often it comes
back to a file it had left.

    python scripts/request_path.py [--case applied|refused|retry] [--modules NAME,...] [--show] [--requests N]

It starts an embedded nats-server (127.0.0.1, a free port, a temporary store) and one in-process daemon with the
smallest app (``rebaser_server.apps.counter``), sends a first request (the change set is taken, its consumer
made), then follows the next delivery of the change set: every call into a module of ``rebaser_server`` made
under the processor's request method (``sys.setprofile``), in the order made. A coroutine resumed after an await
is not counted as called again: the path is the code a reader follows. Consecutive calls within one file are one
*stop*; a *return* is a stop in a file the path had already left.

``--case``: a request the app applies; one it cannot decode (refused: an error reply and a dead letter); one the
app fails once (retry: the attempt is committed and the task retried; the next ownership applies it).
``--modules``: count only these modules, by name (``processor,handling,group``: the same names find them in a
checkout from before the sub-packages, run as ``PYTHONPATH=that/checkout python scripts/request_path.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

import nats

from rebaser_core.embedded import NatsServer
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.settings import Settings

_ENTRY = "_on_request"  # the processor's method the request consumer hands each delivery to


def _package_root() -> Path:
    import rebaser_server

    # A namespace package in a checkout from before rebaser_server had an __init__.
    return Path(next(iter(rebaser_server.__path__))).resolve()


class PathRecorder:
    """Every call into ``root``'s files made under the processor's request method, while :meth:`begin` holds."""

    def __init__(self, root: Path) -> None:
        self._root = str(root) + "/"
        self.paths: list[list[tuple[str, str]]] = []
        self._entry: FrameType | None = None
        self._seen: set[FrameType] = set()  # frames called already: a coroutine resumed is no new stop
        self.done = asyncio.Event()
        self.ended = -1  # the index of the last path followed to its end
        self._current = -1

    def begin(self, entry: FrameType) -> None:
        self._entry = entry
        self._seen = set()
        self.paths.append([])
        self._current = len(self.paths) - 1
        self.done.clear()

    def end(self) -> None:
        self._entry = None
        self._seen = set()
        self.ended = max(self.ended, self._current)
        self.done.set()

    async def wait_beyond(self, index: int) -> None:
        """Until a request whose path is at ``index`` or later has been followed to its end. A request before it
        may still be ending (its reply goes out before its method returns): its end does not count."""
        while self.ended < index:
            self.done.clear()
            await self.done.wait()

    def _inside(self, frame: FrameType | None) -> bool:
        while frame is not None:
            if frame is self._entry:
                return True
            frame = frame.f_back
        return False

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or self._entry is None:
            return
        code = frame.f_code
        if frame in self._seen or not code.co_filename.startswith(self._root):
            return
        if self._inside(frame.f_back):
            self._seen.add(frame)
            self.paths[-1].append((code.co_filename[len(self._root) :], code.co_name))


def _processor_class() -> Any:
    try:
        from rebaser_server.changeset.processor import ChangeSetProcessor
    except ImportError:  # a checkout from before the sub-packages
        from rebaser_server.processor import ChangeSetProcessor  # type: ignore[no-redef]
    return ChangeSetProcessor


def _follow_requests(recorder: PathRecorder) -> None:
    """Wrap the processor's request method: the recorder follows what runs under it."""
    cls = _processor_class()
    original = getattr(cls, _ENTRY)

    async def traced(self: Any, *args: Any, **kwargs: Any) -> Any:
        recorder.begin(sys._getframe())
        try:
            return await original(self, *args, **kwargs)
        finally:
            recorder.end()

    setattr(cls, _ENTRY, traced)


def stops(calls: list[tuple[str, str]]) -> list[tuple[str, list[str]]]:
    """Consecutive calls in one file, as (file, functions called there)."""
    out: list[tuple[str, list[str]]] = []
    for file, function in calls:
        if out and out[-1][0] == file:
            if function not in out[-1][1]:
                out[-1][1].append(function)
        else:
            out.append((file, [function]))
    return out


def summary(calls: list[tuple[str, str]]) -> tuple[int, int, int]:
    """(stops, files, returns to a file already left)."""
    path = stops(calls)
    seen: set[str] = set()
    returns = 0
    for file, _ in path:
        returns += file in seen
        seen.add(file)
    return len(path), len(seen), returns


class _FailsOnce:
    """The counter app, but a request setting ``/fail`` fails once (retryable), then succeeds."""

    def __init__(self) -> None:
        from rebaser_server.apps.counter import CounterApp

        self._app = CounterApp()
        self._failed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._app, name)

    async def apply(self, change_set: Any, state: Any, request: Any) -> Any:
        from rebaser_core.errors import RetryableError

        paths = [getattr(u, "path", "") for u in getattr(request.updates, "updates", [])]
        if "/fail" in paths and not self._failed:
            self._failed = True
            raise RetryableError("failing once, as asked")
        return await self._app.apply(change_set, state, request)


async def follow(case: str, requests: int) -> list[list[tuple[str, str]]]:
    from rebaser_client import RebaserClient, SetLiteral
    from rebaser_server.testing import fast_settings, running_daemon

    recorder = PathRecorder(_package_root())
    _follow_requests(recorder)
    with tempfile.TemporaryDirectory() as store:
        server = NatsServer(store_dir=Path(store), port=0)
        server.start()
        try:
            nc = await nats.connect(server.url)
            # A long quiet period: the change set stays owned between the requests followed.
            settings: Settings = fast_settings("rp" + secrets.token_hex(4), quiescent_period=30.0)
            async with (
                running_daemon(nc, settings, _FailsOnce()),
                RebaserClient(nc, prefix=settings.prefix) as client,
            ):
                wk, cs = WorkspacePk.new(), ChangeSetId.new()
                update = [SetLiteral(path="/n", value=1)]
                await client.enqueue_updates_with_reply(wk, cs, update, timeout=10)
                for _ in range(requests):
                    following = len(recorder.paths)  # the path the next request's delivery begins
                    sys.setprofile(recorder)
                    try:
                        if case == "applied":
                            await client.enqueue_updates_with_reply(wk, cs, update, timeout=10)
                        elif case == "retry":
                            fail = [SetLiteral(path="/fail", value=1)]
                            await client.enqueue_updates_with_reply(wk, cs, fail, timeout=10)
                        else:  # refused: a body that is no request, on the change set's subject
                            subject = settings.subjects.requests(wk, cs)
                            await nc.jetstream().publish(subject, b"not a request")
                        # The reply goes out before the request leaves the stream: follow it to the end.
                        await asyncio.wait_for(recorder.wait_beyond(following), timeout=10)
                    finally:
                        sys.setprofile(None)
            await nc.close()
        finally:
            server.stop()
    return recorder.paths[1:]  # the first request took the change set on


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=1, help="requests to follow, one at a time")
    parser.add_argument(
        "--case",
        choices=("applied", "refused", "retry"),
        default="applied",
        help="applied by the app; refused (undecodable: an error reply and a dead letter); retry (the app fails "
        "once: the attempt is committed, the task retried, the request applied by the next ownership)",
    )
    parser.add_argument(
        "--modules",
        default="",
        help="count only these modules, by name, comma-separated (e.g. processor,handling,group: the same names "
        "find them in a checkout from before the sub-packages)",
    )
    parser.add_argument(
        "--show", action="store_true", help="print every stop with the functions called there"
    )
    args = parser.parse_args()
    print(f"rebaser_server at {_package_root()}")
    for i, followed in enumerate(asyncio.run(follow(args.case, args.requests)), 1):
        modules = set(filter(None, args.modules.split(",")))
        calls = [(f, name) for f, name in followed if not modules or Path(f).stem in modules]
        count, files, returns = summary(calls)
        print(
            f"delivery {i} ({args.case}): {count} stops in {files} files, {returns} returns to a file already left"
        )
        if args.show:
            for file, functions in stops(calls):
                print(f"  {file}: {', '.join(functions)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
