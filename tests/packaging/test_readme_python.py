"""README's Python block (*Enrolling from a web application*) runs as written against the
served simulator, its `...` being the user's consent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx

from lta_worker.protocol import LONG_TERM_SCOPES, TOKENS_PATH
from lta_worker.simulator import Simulator, start_in_thread
from support.docs import block_after
from support.process import Workspace as World

README = Path(__file__).resolve().parents[2] / "README.md"
LONG_TERM = " ".join(["openid", *LONG_TERM_SCOPES])  # the app's own consent


def test_readme_enrollment_block_runs(tmp_path: Path) -> None:
    """README's block enrolls user-42 (consent, then user token) and forgets it upstream too."""
    block = block_after(README.read_text("utf-8"), "python", "## Enrolling from a web application")
    assert "\n    ...\n" in block
    with start_in_thread(Simulator()) as running:
        world = World(running, tmp_path)
        world.store().close()  # the database set up (`db upgrade`)
        world.sim.queue_consent("svc-42")
        code = block.replace(
            "\n    ...\n", "\n    redirect_url = (await consent(url)).headers['location']\n"
        ).replace('"/etc/lta-worker/config.toml"', repr(str(world.config)))
        body = "async def main():\n" + "".join(f"    {line}\n" for line in code.splitlines())

        async def consent(url: str) -> httpx.Response:
            async with httpx.AsyncClient() as http:
                return await http.get(url)

        async def go() -> None:
            namespace: dict[str, Any] = {
                "consent": consent,
                "access_token": world.user_access_token("svc-web", LONG_TERM)[0],
            }
            exec(compile(body, str(README), "exec"), namespace)  # noqa: S102 -- README's code
            await namespace["main"]()

        anyio.run(go)
        with world.store() as store:
            user = store.get_user("user-42")
        calls = [(e.method, e.path, e.status) for e in world.sim.requests()]
    created = [c for c in calls if c[0] == "POST" and c[1].endswith(TOKENS_PATH)]
    assert [c[2] for c in created] == [201, 201], calls  # the consent's and the user token's
    assert [c for c in calls if c[0] == "DELETE" and c[2] == 204], calls  # forget's drop
    assert user is not None and (user.state, user.token) == ("dropped", None)
