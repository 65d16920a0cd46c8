"""The console over HTTPS, in chromium: ``--tls-cert`` and ``--tls-key`` serve it with TLS, the printed URL says
https, the cookie the token becomes is ``Secure`` (and HttpOnly, SameSite=Strict), an action from the page is done,
and a plain HTTP request to the port gets no page. Behind a TLS-terminating proxy (docs/console.md) the console is
told the scheme by ``X-Forwarded-Proto``: the cookie is ``Secure`` and an action from the ``https://`` page is
accepted, as here; without the header, that Origin is foreign. Both bad option pairs are one-line errors."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import aiohttp
import pytest
from click.testing import CliRunner
from nats.aio.client import Client as NatsClient

from rebaser_client._pausing import pause_of
from rebaser_client.admin.cli.main import main as cli
from rebaser_client.admin.console.guard import CSRF_HEADER
from rebaser_core.ids import ChangeSetId, WorkspacePk
from rebaser_core.subjects import Subjects
from tests.integration.console.test_console_guard import TOKEN, _csrf, console_process, deployment
from tests.support.console import chromium, serving_console

__all__ = ["deployment"]  # the fixture, used here


def _self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made by openssl (the test skips without it)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed: the console's TLS test has no certificate to serve")
    cert, key = folder / "console.pem", folder / "console.key"
    subprocess.run(
        [
            *(
                openssl,
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=127.0.0.1",
            ),
            *("-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


async def test_the_console_serves_https_with_a_secure_cookie(
    nc: NatsClient, nats_url: str, deployment: Subjects, tmp_path: Path
) -> None:
    cert, key = _self_signed(tmp_path)
    wk = WorkspacePk.new()
    args = ("--token", TOKEN, "--tls-cert", str(cert), "--tls-key", str(key))
    args += ("--nats-url", nats_url, "--prefix", str(deployment.prefix))
    output: list[str] = []
    async with console_process(*args, output=output) as url, chromium() as browser:
        assert url.startswith("https://127.0.0.1:"), output
        context = await browser.new_context(ignore_https_errors=True)  # the certificate is our own
        page = await context.new_page()
        await page.goto(f"{url}/change-sets?workspace={wk}&token={TOKEN}")
        assert page.url == f"{url}/change-sets?workspace={wk}"
        (cookie,) = await context.cookies()
        assert cookie["secure"] and cookie["httpOnly"] and cookie["sameSite"] == "Strict", cookie
        await page.locator("button.act", has_text="Pause the workspace").click()
        await page.locator("dialog#confirm button.yes").click()
        outcome = page.locator("#outcome p").first
        await outcome.wait_for(timeout=20_000)
        assert (await outcome.inner_text()).startswith(f"paused workspace {wk}")
        await context.close()
        # Plain HTTP to the same port: no page.
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.ClientError):
                async with session.get(url.replace("https://", "http://") + "/") as response:
                    await response.read()
    _, pause = await pause_of(nc, deployment, wk, ChangeSetId.new())
    assert pause is not None


async def test_behind_a_tls_proxy_the_forwarded_scheme_makes_the_cookie_secure_and_the_origin_its_own(
    nc: NatsClient, deployment: Subjects
) -> None:
    wk = WorkspacePk.new()
    # (The cookie is sent by hand: a client's cookie jar keeps a Secure cookie from a plain-HTTP URL, rightly.)
    jar = aiohttp.DummyCookieJar()
    async with (
        serving_console(nc, deployment, token=TOKEN) as console,
        aiohttp.ClientSession(cookie_jar=jar) as session,
    ):
        host = console.url.removeprefix("http://")
        proxied = {"X-Forwarded-Proto": "https"}
        opened = f"{console.url}/change-sets?token={TOKEN}"
        async with session.get(opened, headers=proxied, allow_redirects=False) as response:
            assert response.status == 303
            set_cookie = response.headers["Set-Cookie"]
        assert "Secure" in set_cookie and "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie
        cookie = {"Cookie": set_cookie.split(";")[0].removeprefix("Set-Cookie: ")}
        async with session.get(f"{console.url}/change-sets", headers=proxied | cookie) as response:
            assert response.status == 200
            page = await response.text()
        action = {"targets": [{"workspace_id": str(wk), "change_set_id": None}], "confirm": True}
        headers = cookie | {CSRF_HEADER: _csrf(page), "Origin": f"https://{host}"}
        # Without the proxy's word, an https:// Origin is not this (plain HTTP) console's.
        async with session.post(f"{console.url}/api/actions/pause", json=action, headers=headers) as response:
            assert response.status == 403, await response.text()
        async with session.post(
            f"{console.url}/api/actions/pause", json=action, headers=headers | proxied
        ) as response:
            assert response.status == 200, await response.text()
        # Served plainly (no proxy, no TLS), the cookie is not Secure: else a browser would not send it back.
        async with session.get(f"{console.url}/?token={TOKEN}", allow_redirects=False) as response:
            assert response.status == 303 and "Secure" not in response.headers["Set-Cookie"]
    _, pause = await pause_of(nc, deployment, wk, ChangeSetId.new())
    assert pause is not None


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--tls-cert", "/nonexistent.pem"], "--tls-cert and --tls-key go together"),
        (["--tls-cert", "/nonexistent.pem", "--tls-key", "/nonexistent.key"], "cannot load the certificate"),
    ],
)
def test_bad_tls_options_are_one_line_errors(args: list[str], said: str) -> None:
    result = CliRunner().invoke(cli, ["console", *args])
    assert result.exit_code == 2 and said in result.output, result.output
