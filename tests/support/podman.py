"""The container engine of the container tests (tests/container/): podman, and the images they build.

Debian's podman 4.3 with runc and ``tests/container/containers.conf`` (why: that file). No image registry is
reachable where these tests run, so every image starts from a Debian base made here with debootstrap and
``podman import``, and is built with the package archives and PyPI, which are reachable. The base and the images
that do not depend on the project's code are cached in podman's store, keyed by what they are made of, so a warm
machine builds only the project's image.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "tests" / "container"
CONTAINERS_CONF = HERE / "containers.conf"

# Debian 12: its python3 is the 3.11 of the image's default base (python:3.11-slim).
SUITE = "bookworm"
# python-is-python3: the Dockerfile and its HEALTHCHECK call `python`, as in the python images.
BASE_PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates")
BASE_REPO = "localhost/rebaser-test-base"
# The authorities the host trusts: where a TLS-inspecting proxy stands between a build and PyPI, pip in a build
# verifies PyPI's certificate only with these. The test's base trusts them; the product's Dockerfile knows nothing
# of them.
HOST_CAS = Path("/usr/local/share/ca-certificates")
# Several sessions share the machine and podman's store: one of them makes a cached image at a time.
LOCK = Path(tempfile.gettempdir()) / "rebaser-container-tests.lock"


class Podman:
    """``podman`` with the tests' containers.conf and runc; a failing command raises with its stderr."""

    def __init__(self) -> None:
        self.env = {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}

    def command(self, *args: str) -> list[str]:
        return ["podman", "--runtime", "runc", *args]

    def __call__(
        self, *args: str, timeout: float = 60.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            self.command(*args), env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"podman {' '.join(args)}: exit {result.returncode}\n{result.stderr[-3000:]}"
            )
        return result

    def exists(self, image: str) -> bool:
        return self("image", "exists", image, check=False).returncode == 0

    def inspect(self, name: str) -> dict[str, Any]:
        found: list[dict[str, Any]] = json.loads(self("inspect", name).stdout)
        return found[0]

    def build(self, tag: str, containerfile: Path, context: Path, args: Mapping[str, str]) -> None:
        # --format docker keeps HEALTHCHECK (the OCI format has none). --layers=false leaves no intermediate
        # images behind. --network host: RUN steps reach the package archives as the host does.
        self(
            *("build", "--layers=false", "--format", "docker", "--network", "host"),
            *(f"--build-arg={name}={value}" for name, value in args.items()),
            *("--file", str(containerfile), "--tag", tag, str(context)),
            timeout=900,
        )


def unavailable(podman: Podman) -> str | None:
    """Why no container can run here, in one line; None when one can."""
    if os.geteuid() != 0:
        return "the container tests need root (debootstrap, and podman's bridge networks)"
    missing = [tool for tool in ("podman", "runc", "debootstrap") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed (.ci/run installs them with apt-get)"
    info = podman("info", check=False)
    if info.returncode != 0:
        return f"podman cannot start here: {_last_line(info.stderr)}"
    # A container of one static binary (the nats-server that the project's dependencies bring): the engine is
    # tried before minutes go into a base image.
    binary = Path(sys.executable).parent / "nats-server"
    probe = "localhost/rebaser-test-probe:latest"
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "probe.tar"
        subprocess.run(["tar", "-C", str(binary.parent), "-cf", str(archive), binary.name], check=True)
        imported = podman("import", str(archive), probe, check=False)
    if imported.returncode != 0:
        return f"podman cannot store an image here: {_last_line(imported.stderr)}"
    try:
        run = podman("run", "--rm", "--network", "none", probe, f"/{binary.name}", "--version", check=False)
    finally:
        podman("rmi", "--force", probe, check=False)
    if run.returncode != 0:
        return f"podman cannot run a container here: {_last_line(run.stderr)}"
    return None


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


@contextlib.contextmanager
def _cache_lock() -> Iterator[None]:
    with LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _drop_other_tags(podman: Podman, repository: str, keep: str) -> None:
    """Older cached versions of one image go: the store keeps one per repository."""
    listed = podman("images", "--format", "{{.Repository}}:{{.Tag}}", repository).stdout.split()
    for old in listed:
        if old != keep:
            podman("rmi", old, check=False)  # one a container still uses stays: a later run removes it


def base_image(podman: Podman) -> str:
    """The Debian base (cached): debootstrap's minimal system with Python 3.11, trusting the host's authorities."""
    cas = sorted(HOST_CAS.glob("**/*.crt")) if HOST_CAS.is_dir() else []
    key = hashlib.sha256(json.dumps([SUITE, BASE_PACKAGES, _BASE_RECIPE_VERSION]).encode())
    for ca in cas:
        key.update(ca.read_bytes())
    tag = f"{BASE_REPO}:{SUITE}-{key.hexdigest()[:12]}"
    with _cache_lock():
        if podman.exists(tag):
            return tag
        with tempfile.TemporaryDirectory(prefix="rebaser-base-", dir="/var/tmp") as tmp:
            rootfs = Path(tmp) / "rootfs"
            try:
                _debootstrap(rootfs, cas)
                _import(podman, rootfs, tag)
            finally:
                _unmount_below(rootfs)  # a debootstrap that failed half-way may leave /proc mounted in it
        _drop_other_tags(podman, BASE_REPO, tag)
    return tag


# Raised when the recipe below changes, so that a cached base made by the old one is not reused.
_BASE_RECIPE_VERSION = 1


def _debootstrap(rootfs: Path, cas: list[Path]) -> None:
    command = ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", SUITE, str(rootfs)]
    mirror = _host_mirror()
    if mirror:
        command.append(mirror)
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    if result.returncode != 0:
        raise AssertionError(
            f"debootstrap: exit {result.returncode}\n{(result.stdout + result.stderr)[-3000:]}"
        )
    for ca in cas:
        shutil.copy(ca, rootfs / "usr/local/share/ca-certificates" / ca.name)
    subprocess.run(
        ["chroot", str(rootfs), "update-ca-certificates"], capture_output=True, check=True, timeout=120
    )
    # pip verifies with its own bundle unless told to use the system's (which now has the host's authorities).
    (rootfs / "etc/pip.conf").write_text("[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n")
    # apt's lists are fetched again by every build that installs a package; docs and man pages serve nobody.
    for unused in ("var/lib/apt/lists", "var/cache/apt", "usr/share/doc", "usr/share/man"):
        shutil.rmtree(rootfs / unused, ignore_errors=True)
    (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True)
    (rootfs / "var/cache/apt/archives/partial").mkdir(parents=True)


def _host_mirror() -> str | None:
    """The Debian archive the host's apt uses (deb822 sources), so the base comes from where packages do here;
    None: debootstrap's own default."""
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    if not sources.is_file():
        return None
    for stanza in sources.read_text().split("\n\n"):
        fields = dict(
            line.split(":", 1) for line in stanza.splitlines() if ":" in line and not line.startswith("#")
        )
        if SUITE in fields.get("Suites", "").split():
            uris = fields.get("URIs", "").split()
            if uris and uris[0].rstrip("/").endswith("/debian"):
                return uris[0]
    return None


def _import(podman: Podman, rootfs: Path, tag: str) -> None:
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    try:
        imported = subprocess.run(
            podman.command("import", "--change", "ENV LANG=C.UTF-8", "--change", 'CMD ["python3"]', "-", tag),
            stdin=tar.stdout,
            env=podman.env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    finally:
        assert tar.stdout is not None
        tar.stdout.close()
        tar.wait(60)
    if imported.returncode != 0 or tar.returncode != 0:
        raise AssertionError(
            f"podman import: exit {imported.returncode}, tar {tar.returncode}\n{imported.stderr}"
        )


def _unmount_below(path: Path) -> None:
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for mount in sorted((m for m in mounts if m.startswith(f"{path}/")), reverse=True):
        subprocess.run(["umount", "--lazy", mount], check=False, timeout=60)


def cached_image(podman: Podman, repository: str, containerfile: Path, args: Mapping[str, str]) -> str:
    """An image of a Containerfile under tests/container/ that does not depend on the project's code (cached,
    keyed by the file and its build arguments, the base image among them)."""
    key = hashlib.sha256(containerfile.read_bytes() + json.dumps(dict(args), sort_keys=True).encode())
    tag = f"{repository}:{key.hexdigest()[:12]}"
    with _cache_lock():
        if not podman.exists(tag):
            podman.build(tag, containerfile, containerfile.parent, args)
            _drop_other_tags(podman, repository, tag)
    return tag
