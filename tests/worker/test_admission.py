"""`Admission`, the connection bookkeeping of both listeners, as a Hypothesis model: the cap
holds, a newcomer is refused only when every kept connection is being answered, and room is
made from the oldest connection still sending its head."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from lta_worker.worker._listen import Admission

_OPS = st.lists(
    st.tuples(
        st.sampled_from(["connect", "head", "answered", "expire", "close"]), st.integers(0, 50)
    ),
    max_size=200,
)


@given(cap=st.integers(1, 6), ops=_OPS)
def test_admission_keeps_the_cap_and_makes_room_from_the_oldest_head(
    cap: int, ops: list[tuple[str, int]]
) -> None:
    """The cap holds; room is made only from the oldest connections still sending their heads."""
    admission = Admission(cap, deadline=10.0)
    order: list[int] = []  # connections in the order they came, while they wait
    now = 0.0
    for n, (op, pick) in enumerate(ops):
        now += 1.0
        kept = list(admission.waiting) + list(admission.answering)
        if op == "connect":
            all_answering = len(admission.answering) >= cap
            admitted, evicted = admission.admit(n, now)
            assert admitted is not all_answering
            assert evicted == order[: len(evicted)]
            del order[: len(evicted)]
            if admitted:
                order.append(n)
        elif op == "expire":
            late = admission.expired(now)
            assert late == order[: len(late)]
            del order[: len(late)]
            assert all(deadline > now for deadline in admission.waiting.values())
        elif kept:
            conn = kept[pick % len(kept)]
            if op == "head":
                assert admission.head_done(conn) is (conn in order)
                if conn in order:
                    order.remove(conn)
            elif op == "answered":  # kept open for its next request: the newest waiting one
                if conn in admission.answering:
                    admission.wait_again(conn, now)
                    order.append(conn)
            else:
                admission.release(conn)
                if conn in order:
                    order.remove(conn)
        assert admission.kept == len(admission.waiting) + len(admission.answering) <= cap
        assert list(admission.waiting) == order
