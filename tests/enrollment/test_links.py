"""Signed enrollment links, the `[enroll]` settings, the link key file, and `enroll link`."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lta_worker.config import build_settings, parse_listen, read_link_keys
from lta_worker.enrollment import EnrollLinks
from lta_worker.enrollment._links import LinkError
from lta_worker.errors import EX_CONFIG, EX_USAGE, ConfigError, UsageError
from lta_worker.secret import Secret
from support.configs import BASE
from support.enroll import write_private
from support.process import Output, run_here

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
START = "https://app.example/enroll/start"
OLD, NEW = Secret("o" * 40), Secret("n" * 40)
Cli = Callable[..., Output]


def token_of(link: str) -> str:
    return parse_qs(urlsplit(link).query)["link"][0]


def test_a_link_round_trips_until_it_expires() -> None:
    """A link names its user until its expiry, and is refused as expired from then on."""
    links = EnrollLinks([NEW], START)
    link = links.make("alice", NOW, timedelta(hours=2))
    assert link.startswith(START + "?link=")
    claim = links.read(token_of(link), NOW + timedelta(hours=2) - timedelta(seconds=1))
    assert claim.user == "alice"
    assert claim.expires_at == NOW + timedelta(hours=2)
    with pytest.raises(LinkError) as expired:
        links.read(token_of(link), NOW + timedelta(hours=2))
    assert (expired.value.problem, expired.value.user) == ("link_expired", "alice")


def test_two_links_for_one_user_have_different_nonces() -> None:
    """Each link carries its own nonce, so spending one never spends another."""
    links = EnrollLinks([NEW], START)
    first, second = (links.read(token_of(links.make("a", NOW, timedelta(hours=1))), NOW)
                     for _ in range(2))  # fmt: skip
    assert first.nonce != second.nonce


def test_key_rotation_the_newest_signs_every_key_verifies() -> None:
    """The newest link key signs, every listed key verifies, a removed key's links are refused."""
    old_link = EnrollLinks([OLD], START).make("alice", NOW, timedelta(hours=1))
    rotated = EnrollLinks([OLD, NEW], START)
    assert rotated.read(token_of(old_link), NOW).user == "alice"
    new_link = rotated.make("bob", NOW, timedelta(hours=1))
    assert EnrollLinks([NEW], START).read(token_of(new_link), NOW).user == "bob"
    with pytest.raises(LinkError, match="link_invalid"):
        EnrollLinks([NEW], START).read(token_of(old_link), NOW)


@pytest.mark.parametrize("valid", [timedelta(seconds=59), timedelta(days=31), timedelta(0)])
def test_a_link_lives_one_minute_to_thirty_days(valid: timedelta) -> None:
    """A validity outside 1 minute .. 30 days is a usage error."""
    with pytest.raises(UsageError):
        EnrollLinks([NEW], START).make("alice", NOW, valid)


@given(st.text(max_size=300))
def test_any_text_is_a_valid_link_or_refused_as_invalid(text: str) -> None:
    """Reading arbitrary text never raises anything but `LinkError(link_invalid)`."""
    with pytest.raises(LinkError, match="link_invalid"):
        EnrollLinks([NEW], START).read(text, NOW)


def _settings(enroll: dict[str, Any], redirect: str = "https://app.example/lta/callback") -> Any:
    return build_settings(
        {**BASE, "client": {"id": "c", "redirect_uri": redirect}, "enroll": enroll}
    )


@pytest.mark.parametrize(
    ("enroll", "redirect", "key"),
    [
        ({"listen": "127.0.0.1:8080"}, None, "enroll.public_url"),
        ({"listen": "nonsense"}, None, "enroll.listen"),
        ({"listen": "127.0.0.1:70000"}, None, "enroll.listen"),
        ({"public_url": "http://app.example"}, None, "enroll.public_url"),
        ({"return_url": "ftp://x"}, None, "enroll.return_url"),
        (
            {"listen": "127.0.0.1:8080", "public_url": "https://app.example"},
            "https://other.example/lta/callback",
            "client.redirect_uri",
        ),
        (
            {"listen": "127.0.0.1:8080", "public_url": "https://app.example"},
            "https://app.example/enroll/start",
            "client.redirect_uri",
        ),
        (
            {"listen": "127.0.0.1:8080", "public_url": "https://app.example:8443"},
            None,
            "client.redirect_uri",
        ),
    ],
)
def test_enroll_settings_that_do_not_fit_exit_78_naming_the_key(
    enroll: dict[str, Any], redirect: str | None, key: str
) -> None:
    """`[enroll]` settings that do not fit together are a ConfigError naming the key."""
    with pytest.raises(ConfigError) as raised:
        _settings(enroll, *([redirect] if redirect else []))
    assert raised.value.key == key
    assert raised.value.exit_code == EX_CONFIG


def test_enroll_settings_that_fit() -> None:
    """A listener, an https public URL with the callback on its origin and a return URL load."""
    settings = _settings(
        {
            "listen": "[::1]:8080",
            "public_url": "https://app.example/",
            "return_url": "https://app.example/done?x=1",
        }
    )
    assert settings.enroll.public_url == "https://app.example"
    assert parse_listen(settings.enroll.listen) == ("::1", 8080)


def test_link_key_file_one_key_per_line_comments_allowed(tmp_path: Path) -> None:
    """Keys are read oldest first; comments and blank lines are skipped."""
    path = write_private(tmp_path / "k", f"# old\n{OLD.reveal()}\n\n{NEW.reveal()}\n")
    assert read_link_keys(_settings({"link_key_file": str(path)})) == (OLD, NEW)


@pytest.mark.parametrize(
    ("content", "mode", "words"),
    [
        ("short-key\n", 0o600, "line 1 is not a key"),
        ("# nothing\n", 0o600, "holds no key"),
        ("k" * 40 + " with space\n", 0o600, "line 1 is not a key"),
        ("k" * 40 + "\n", 0o644, "readable by group or others"),
    ],
)
def test_a_bad_link_key_file_exits_78_without_its_content(
    tmp_path: Path, content: str, mode: int, words: str
) -> None:
    """A bad or exposed link key file is a ConfigError naming it, never showing its content."""
    path = tmp_path / "k"
    path.write_text(content, encoding="utf-8")
    os.chmod(path, mode)
    with pytest.raises(ConfigError) as raised:
        read_link_keys(_settings({"link_key_file": str(path)}))
    assert raised.value.key == "enroll.link_key_file"
    assert words in str(raised.value)
    assert "short-key" not in str(raised.value) and "k" * 40 not in str(raised.value)


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    """`lta-worker enroll link ARGS` in-process with `[enroll]` ENROLL."""

    def run(enroll: str, *args: str) -> Output:
        config = tmp_path / "lta.toml"
        config.write_text(
            '[service]\nbase_url = "https://api.example"\nauth_url = "https://api.example"\n'
            '[client]\nid = "c"\nredirect_uri = "https://app.example/lta/callback"\n'
            f'[database]\nurl = "sqlite:///{tmp_path / "never.db"}"\n[enroll]\n{enroll}\n',
            encoding="utf-8",
        )
        return run_here(["--config", str(config), "enroll", "link", *args])

    return run


def test_enroll_link_prints_a_link_that_verifies(tmp_path: Path, cli: Cli) -> None:
    """`enroll link --user ID --valid 2h` prints one verifiable link, making no database."""
    keys = write_private(tmp_path / "link-key", NEW.reveal() + "\n")
    enroll = f'public_url = "https://app.example/lta"\nlink_key_file = "{keys}"'
    before = datetime.now(UTC)
    done = cli(enroll, "--user", "alice", "--valid", "2h")
    assert done.returncode == 0, done.stderr
    link = done.stdout.strip()
    assert done.stdout.count("\n") == 1
    assert link.startswith("https://app.example/lta/enroll/start?link=")
    claim = EnrollLinks([NEW], START).read(token_of(link), datetime.now(UTC))
    assert claim.user == "alice"
    assert before + timedelta(hours=2) - timedelta(seconds=2) <= claim.expires_at
    assert claim.expires_at <= datetime.now(UTC) + timedelta(hours=2)
    assert not (tmp_path / "never.db").exists()


@pytest.mark.parametrize(
    ("enroll", "args", "code", "words"),
    [
        ("", ["--user", "alice"], EX_CONFIG, "enroll.public_url"),
        ('public_url = "https://app.example"', ["--user", "a"], EX_CONFIG, "link_key_file"),
        (
            'public_url = "https://app.example"',
            ["--user", "a", "--valid", "x"],
            EX_USAGE,
            "--valid",
        ),
    ],
)
def test_enroll_link_refusals_are_one_line(
    cli: Cli, enroll: str, args: list[str], code: int, words: str
) -> None:
    """No public URL or key file exits 78, a bad --valid 2; one line, nothing on stdout."""
    done = cli(enroll, *args)
    assert done.returncode == code, done.stderr
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1
    assert words in done.stderr
