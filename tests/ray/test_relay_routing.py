"""How `relay.Route` splits one call between branches and nodes (driver side, no cluster).

Each relay handle here records what the driver hands it and answers with a token; the relays'
own replies are then made as the real ones make them (a node's list in the order of its
indices, a branch's lists one after the other in the order of its parts), so the property
checks that every worker's reply comes back to its own place in the call (`RelayedRefs.at`),
that each relay sees its calls numbered one after the other, and that the driver sends one task
per branch the call reaches. The real relays run in `test_relay.py`.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from twinkle_ray.relay import Route


class _Method:
    def __init__(self, log: list, relay: int, name: str) -> None:
        self.log, self.relay, self.name = log, relay, name

    def remote(self, call: Any) -> tuple:
        token = ("task", len(self.log))
        self.log.append((token, self.relay, self.name, call))
        return token


class _Relay:
    def __init__(self, log: list, relay: int) -> None:
        self.fanout = _Method(log, relay, "fanout")
        self.branch = _Method(log, relay, "branch")


@st.composite
def layouts(draw: Any) -> tuple[list[list[int]], int, list[list[int]]]:
    """Ranks spread over nodes, a fanout, and calls (each a subset of the ranks, in rank
    order, as core targets them)."""
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=9))
    ranks = list(range(sum(sizes)))
    order = draw(st.permutations(ranks))  # nodes need not hold consecutive ranks
    by_node, start = [], 0
    for size in sizes:
        by_node.append(sorted(order[start : start + size]))
        start += size
    fanout = draw(st.integers(1, len(sizes) + 1))
    calls = draw(
        st.lists(
            st.lists(st.sampled_from(ranks), min_size=1, unique=True).map(sorted),
            min_size=1,
            max_size=4,
        )
    )
    return by_node, min(fanout, len(sizes)), calls


def _replies(log_entry: tuple, route: Route) -> list[int]:
    """What the relay answering `log_entry` returns: the ranks of the workers it ran."""
    _, relay, name, call = log_entry
    if name == "fanout":
        _, _, indices, _, _, _ = call
        return [route.ranks_by_node[relay][i] for i in indices]
    _, parts = call
    out = []
    for peer, _, indices, _, _ in parts:
        node = relay + 1 + peer  # -1: the branch's first, the relay itself
        out.extend(route.ranks_by_node[node][i] for i in indices)
    return out


@settings(max_examples=150, deadline=None)
@given(layouts())
def test_each_worker_gets_its_own_reply_in_order_from_one_task_per_branch(layout):
    by_node, fanout, calls = layout
    log: list = []
    route = Route([_Relay(log, n) for n in range(len(by_node))], by_node, fanout)
    seqs: dict[int, list[int]] = {n: [] for n in range(len(by_node))}
    for ranks in calls:
        shipped = [((f"arg-{rank}",), {}) for rank in ranks]
        before = len(log)
        refs = route.send("m", ranks, shipped)
        sent = log[before:]
        # One task per branch reached; a branch reached on one node only goes to it directly.
        nodes = {route.where[r][0] for r in ranks}
        branches = {n // fanout for n in nodes}
        assert len(sent) == len(branches) == len(refs.nodes)
        for _token, relay, name, call in sent:
            reached = {n for n in nodes if n // fanout == relay // fanout}
            if name == "fanout":
                assert reached == {relay}
                seq, _, indices, shared, arguments, origin = call
                seqs[relay].append(seq)
                assert origin is None
                got = [route.ranks_by_node[relay][i] for i in indices]
                want = arguments if not shared else [arguments] * len(indices)
                assert [((f"arg-{r}",), {}) for r in got] == list(want)
            else:
                assert relay % fanout == 0 and len(reached) > 1
                _, parts = call
                assert {relay + 1 + p for p, *_ in parts} == reached
                for peer, seq, _, _, _ in parts:
                    seqs[relay + 1 + peer].append(seq)
        lists = [_replies(entry, route) for entry in sent]
        assert [entry[0] for entry in sent] == list(refs.nodes)
        assert refs.expand(lists) == ranks  # each worker's own reply, in the call's order
        assert list(refs) == [refs.nodes[t] for t, _ in refs.at]
    for node, numbers in seqs.items():
        assert numbers == list(range(len(numbers))), (node, numbers)
