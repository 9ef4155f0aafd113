"""docs/simulator.md lists exactly the control API's routes."""

from __future__ import annotations

import re
from pathlib import Path

from lta_worker.simulator import Simulator
from lta_worker.simulator.control import control_routes

DOC = Path(__file__).resolve().parents[2] / "docs" / "simulator.md"


def test_the_doc_lists_every_control_route() -> None:
    """Every (method, path) of the control API is a row of the doc's table, and no more."""
    documented = set(
        re.findall(r"^\| `([A-Z]+)` \| `/_sim(/[^`]*)` \|", DOC.read_text(), flags=re.MULTILINE)
    )
    served = {
        (method, route.path)
        for route in control_routes(Simulator())
        for method in route.methods or ()
        if method != "HEAD"
    }
    assert documented == served
