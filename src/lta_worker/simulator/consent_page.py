"""The simulator's consent page: the account, the requested scopes to untick, Allow / Deny.

One plain HTML form, no script; every value is escaped. It posts to `/oidc/consent`, which
`oauth.decide` answers. The real service's page looks different; what matters for a client
is the same: the scopes the user leaves ticked are the scopes granted.
"""

from __future__ import annotations

import html

from lta_worker.simulator.oauth import ConsentPage

_LABELS = {
    "cloud-sync.permanent.latest-change": "Read your latest change, at any time",
    "cloud-sync.permanent.stats": "Read your statistics, at any time",
    "cloud-sync.history": "Read your history",
}


def render_consent(page: ConsentPage, action: str) -> str:
    """The consent page of `page`, posting to `action`."""
    esc = html.escape
    boxes = "".join(
        f'<div><input type="checkbox" id="scope-{n}" name="scope" value="{esc(scope)}" checked>'
        f' <label for="scope-{n}">{esc(_LABELS.get(scope, scope))} '
        f"(<code>{esc(scope)}</code>)</label></div>\n"
        for n, scope in enumerate(page.scopes)
    )
    return f"""<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>Allow access? (simulator)</title></head>
<body>
<main>
<h1>Allow <strong>{esc(page.client)}</strong> to access your account?</h1>
<form method="post" action="{esc(action)}">
<input type="hidden" name="request" value="{esc(page.request_id)}">
<p><label for="account">Signed in as</label>
<input type="text" id="account" name="account" value="{esc(page.account)}" required></p>
<fieldset><legend>What it may do (untick what you do not want to share)</legend>
{boxes}</fieldset>
<p><button type="submit" id="allow" name="decision" value="allow">Allow</button>
<button type="submit" id="deny" name="decision" value="deny">Deny</button></p>
</form>
</main>
</body>
</html>
"""
