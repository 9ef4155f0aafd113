"""README's Python block (*Enrolling from a web application*) runs as written against the
served simulator, its `...` being the user's consent: each call it shows enrolls or forgets
as its comment says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx

from lta_worker.enrollment import challenge_s256
from lta_worker.protocol import TOKENS_PATH
from lta_worker.runtime import Runtime
from lta_worker.secret import Secret
from lta_worker.simulator import DEMO_CLIENT_ID, DEMO_CLIENT_SECRET, Simulator, start_in_thread
from support.docs import block_after
from support.enroll import basic, query_of
from support.process import REDIRECT
from support.process import Workspace as World

README = Path(__file__).resolve().parents[2] / "README.md"


async def user_access_token(world: World, settings: Any) -> str:
    """A user access token from the app's own long term consent (its own PKCE flow)."""
    world.sim.queue_consent("svc-web")
    verifier = Secret("v" * 43)
    async with Runtime(settings) as runtime:
        url = runtime.enrollment().consent_url("st" * 22, challenge_s256(verifier))
    async with httpx.AsyncClient() as http:
        code = query_of((await http.get(url)).headers["location"])["code"]
        answer = await http.post(
            f"{world.running.auth_url}/oidc/token",
            data={
                "grant_type": "authorization_code",
                "code": code,
                "redirect_uri": REDIRECT,
                "code_verifier": verifier.reveal(),
            },
            headers={"Authorization": basic(DEMO_CLIENT_ID, DEMO_CLIENT_SECRET)},
        )
    assert answer.status_code == 200, answer.text
    token: str = answer.json()["access_token"]
    return token


def test_readme_enrollment_block_runs(tmp_path: Path) -> None:
    """README's block enrolls user-42 (consent, then user token) and forgets it upstream too."""
    block = block_after(README.read_text("utf-8"), "python", "## Enrolling from a web application")
    assert "\n    ...\n" in block
    with start_in_thread(Simulator()) as running:
        world = World(running, tmp_path)
        world.store().close()  # the database set up (`db upgrade`)
        settings = world.settings()
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
                "access_token": await user_access_token(world, settings),
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
