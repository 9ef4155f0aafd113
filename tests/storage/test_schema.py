"""Schema: migrations create the models' schema, the head constant, too-new and behind databases."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from datetime import datetime, timedelta, timezone

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.exc import StatementError

from lta_worker.errors import SchemaTooNewError, StorageError
from lta_worker.storage import Store, Vault, schema_metadata
from lta_worker.storage import _migrate as migrate
from lta_worker.storage._db import normalize_url
from support.storage import T0, enroll, keyring


def test_head_constant_equals_alembic_head() -> None:
    """HEAD_REVISION and REVISIONS are exactly what Alembic finds in the packaged migrations."""
    scripts = ScriptDirectory.from_config(migrate.alembic_config())
    assert scripts.get_heads() == [migrate.HEAD_REVISION]
    walked = [rev.revision for rev in scripts.walk_revisions()]
    assert tuple(reversed(walked)) == migrate.REVISIONS


def test_upgrade_creates_schema_once(empty_url: str) -> None:
    """check_schema on an empty database refuses it (`schema_outdated`, 78: the CLI's line says
    `run lta-worker db upgrade`, tests/cli/test_hints.py); upgrade() migrates it to head once."""
    with Store.open(empty_url) as store:
        assert store.schema_revision() is None
        with pytest.raises(StorageError) as info:
            store.check_schema()
        assert (info.value.reason, info.value.exit_code) == ("schema_outdated", 78)
        assert store.upgrade() is True
        assert store.schema_revision() == migrate.HEAD_REVISION
        assert store.upgrade() is False
        store.check_schema()


def test_migrated_schema_matches_models(empty_url: str) -> None:
    """The migrations create exactly the schema the models describe (no autogenerate diff)."""
    with Store.open(empty_url) as store:
        store.upgrade()
        with store.database.engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(context, schema_metadata()) == []


def test_newer_schema_is_refused(store: Store) -> None:
    """A database stamped by a newer lta-worker is refused (exit 78) and left untouched."""
    enroll(store, Vault(keyring("k1")), "alice")
    with store.database.write() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999_future'"))
    for call in (store.check_schema, store.upgrade):
        with pytest.raises(SchemaTooNewError) as info:
            call()
        assert "'9999_future'" in str(info.value)
        assert info.value.exit_code == 78
    assert store.schema_revision() == "9999_future"
    assert store.get_user("alice") is not None


def test_behind_schema_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """A known older revision is 'behind'; an unknown one is too new; none is 'empty'."""
    monkeypatch.setattr(migrate, "REVISIONS", ("0000", "0001"))
    assert migrate.classify("0000") == "behind"
    assert migrate.classify(migrate.HEAD_REVISION) == "current"
    assert migrate.classify(None) == "empty"
    with pytest.raises(SchemaTooNewError):
        migrate.classify("9999")


def test_current_schema_check_does_not_import_alembic(store_url: str) -> None:
    """Opening a current database and calling upgrade() never imports Alembic (fast start)."""
    code = textwrap.dedent(
        f"""
        import sys
        from lta_worker.storage import Store
        store = Store.open({store_url!r})
        assert store.upgrade() is False
        store.check_schema()
        store.close()
        print(sorted(m for m in sys.modules if m == "alembic" or m.startswith("alembic.")))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_concurrent_upgrades_all_succeed(empty_url: str) -> None:
    """Three processes upgrading the same empty database at once all succeed, once."""
    code = textwrap.dedent(
        f"""
        import sys
        from lta_worker.storage import Store
        sys.stdin.read()
        with Store.open({empty_url!r}) as store:
            store.upgrade()
            store.check_schema()
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.close()
    assert [proc.wait(timeout=60) for proc in procs] == [0, 0, 0]
    with Store.open(empty_url) as store:
        assert store.schema_revision() == migrate.HEAD_REVISION


@pytest.mark.parametrize(
    ("url", "driver"),
    [
        ("postgresql://u@h/db", "postgresql+psycopg"),
        ("postgres://u:p@h:5433/db", "postgresql+psycopg"),
        ("postgresql+psycopg://u@h/db", "postgresql+psycopg"),
        ("sqlite:////var/lib/lta-worker/lta.db", "sqlite"),
        ("sqlite://", "sqlite"),
    ],
)
def test_urls_map_to_psycopg(url: str, driver: str) -> None:
    """postgresql:// and postgres:// URLs use psycopg 3; SQLite URLs stay as they are (other
    drivers refused at load: tests/config/test_settings.py)."""
    assert normalize_url(url).drivername == driver


def test_datetimes_come_back_aware_utc(store: Store) -> None:
    """A datetime in another zone is stored as the same instant and returned in UTC; a naive
    one is refused instead of guessing its zone."""
    with pytest.raises(StatementError, match="timezone-aware"):
        store.count_due(datetime(2025, 1, 1))
    paris = timezone(timedelta(hours=2))
    enroll(store, Vault(keyring()), "alice", due=T0.astimezone(paris))
    row = store.get_user("alice")
    assert row is not None
    assert row.next_due_at == T0
    assert row.next_due_at.utcoffset() == timedelta(0)
