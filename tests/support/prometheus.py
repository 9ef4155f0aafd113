"""Debian's `prometheus` and `prometheus-node-exporter` on free loopback ports, and Prometheus's
query API; tests skip, saying why, where the binaries are missing (.ci/run installs them)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from support.process import free_port

PROMETHEUS = shutil.which("prometheus")
NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
MISSING_PROMETHEUS = "prometheus is not installed (Debian: apt-get install prometheus)"
MISSING_NODE_EXPORTER = (
    "prometheus-node-exporter is not installed (Debian: apt-get install prometheus-node-exporter)"
)


def http_get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    """GET `url`: (status, body), an HTTP error status included; (0, reason) when refused."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:  # noqa: S310 - loopback
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while http_get(url, timeout=2)[0] != 200:
        if proc.poll() is not None:
            raise AssertionError(f"{url}: exited with {proc.returncode}: {log.read_text()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{url}: not ready after {timeout} s: {log.read_text()}")
        time.sleep(0.1)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


class Prometheus:
    """The HTTP API of a running Prometheus."""

    def __init__(self, base: str) -> None:
        self.base = base

    def api(self, path: str, **params: str) -> Any:
        """GET `/api/v1/{path}`: the `data` of a success; AssertionError with Prometheus's
        error (a query that does not parse, say) otherwise."""
        query = urllib.parse.urlencode(params)
        status, body = http_get(f"{self.base}/api/v1/{path}?{query}")
        answer = json.loads(body) if body.startswith("{") else {"error": body}
        assert status == 200, f"{path} {params}: HTTP {status}: {answer.get('error')}"
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result (a vector or a scalar, as a list of samples)."""
        data = self.api("query", query=expr)
        if data["resultType"] == "vector":
            result: list[dict[str, Any]] = data["result"]
            return result
        return [{"metric": {}, "value": data["result"]}]

    def values(self, expr: str) -> list[float]:
        """The values of an instant query's samples."""
        return [float(sample["value"][1]) for sample in self.query(expr)]

    def has_data(self, expr: str) -> bool:
        """Whether `expr` returns at least one sample and every value is a number."""
        values = self.values(expr)
        return bool(values) and all(not math.isnan(v) for v in values)


@contextmanager
def running_prometheus(
    tmp: Path, jobs: dict[str, str], rule_files: list[Path], timeout: float = 30.0
) -> Iterator[Prometheus]:
    """Prometheus on a free loopback port, scraping each `jobs` name -> target every
    second, with `rule_files` loaded; stopped (its pid only) on exit."""
    assert PROMETHEUS is not None, MISSING_PROMETHEUS
    tmp.mkdir(parents=True, exist_ok=True)
    config = tmp / "prometheus.yml"
    scrape = "".join(
        f"  - job_name: {job}\n    static_configs: [{{targets: ['{target}']}}]\n"
        for job, target in jobs.items()
    )
    rules = ", ".join(f"'{path}'" for path in rule_files)
    config.write_text(
        "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"
        f"rule_files: [{rules}]\n"
        f"scrape_configs:\n{scrape}",
        encoding="utf-8",
    )
    port = free_port()
    log = tmp / "prometheus.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        _wait_ready(f"http://127.0.0.1:{port}/-/ready", proc, log, timeout)
        yield Prometheus(f"http://127.0.0.1:{port}")
    finally:
        _stop(proc)


@contextmanager
def running_node_exporter(textfile_dir: Path, log: Path, timeout: float = 30.0) -> Iterator[str]:
    """node_exporter with only its textfile collector, reading `textfile_dir`, on a free
    loopback port; yields its /metrics URL and is stopped (its pid only) on exit."""
    assert NODE_EXPORTER is not None, MISSING_NODE_EXPORTER
    port = free_port()
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [
                NODE_EXPORTER,
                "--collector.disable-defaults",
                "--collector.textfile",
                f"--collector.textfile.directory={textfile_dir}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        _wait_ready(url, proc, log, timeout)
        yield url
    finally:
        _stop(proc)
