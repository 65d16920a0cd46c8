"""``rebaser status`` per workspace, its pure parts: the busiest workspaces from the streams' counts and the
daemons' owned counts, as JSON and as a table."""

from __future__ import annotations

from rich.console import Console

from rebaser_client.admin import format as fmt
from rebaser_client.admin.format_workspaces import workspaces_json, workspaces_view
from rebaser_client.admin.status import StatusReport
from rebaser_client.admin.workspaces import DaemonsOwned, busiest_workspaces

COUNTS = [
    (("A", "1"), {"task": 1, "queued": 3}),
    (("A", "2"), {"task": 1, "queued": 1}),
    (("A", "3"), {"task": 1}),
    (("B", "1"), {"task": 1, "queued": 2}),
    (("C", "1"), {"dead": 4}),  # dead letters only: no work
    (("D", "1"), {"queued": 1}),  # queued, its task not published yet (or swept later)
]


def _render(renderable: object) -> str:
    console = Console(width=200, record=True)
    console.print(renderable)
    return console.export_text()


def test_the_busiest_workspaces_first_with_owned_and_waiting() -> None:
    owned = DaemonsOwned({"A": 2, "E": 1}, read=2)
    lines, total = busiest_workspaces(COUNTS, owned)
    assert (
        total == 4
    )  # A, B, D and E (owned as a daemon says, its task not in the stream read a moment before)
    assert [(w.workspace_id, w.owned, w.waiting, w.tasks, w.queued) for w in lines] == [
        ("A", 2, 1, 3, 4),
        ("B", 0, 1, 1, 2),
        ("E", 1, 0, 0, 0),  # owned first
        ("D", 0, 0, 0, 1),
    ]
    assert busiest_workspaces(COUNTS, owned, limit=1)[0][0].workspace_id == "A"


def test_without_a_daemon_read_owned_and_waiting_are_unknown() -> None:
    lines, _ = busiest_workspaces(COUNTS, DaemonsOwned({}, 0, ("http://d:9464/status: refused",)))
    assert all(w.owned is None and w.waiting is None for w in lines)
    report = StatusReport(None, (), None, 0, (), 0, workspaces=lines, workspaces_total=3)
    data = fmt.status_json(report)
    assert data["workspaces"][0] == {
        "workspace_id": "A",
        "owned": None,
        "waiting": None,
        "tasks": 3,
        "queued": 4,
        "served": None,
    }
    assert data["daemons_read"] == 0
    text = _render(fmt.status_view(report))
    assert "workspaces with work: 3" in text and "busiest listed" not in text
    assert "owned and waiting not shown: they come from the daemons; give --daemon-url to read them" in text
    header = next(line for line in text.splitlines() if "workspace" in line and "queued" in line)
    assert "owned" not in header and "waiting" not in header and "?" not in text  # no column of unknowns


def test_the_table_lists_the_busiest_and_says_how_many_there_are() -> None:
    daemons = DaemonsOwned({"A": 2}, 1, ("http://d2:9464/status: URLError refused",))
    lines, total = busiest_workspaces(COUNTS, daemons, limit=2)
    text = _render(
        fmt.status_view(
            StatusReport(None, (), None, 0, (), 0, workspaces=lines, workspaces_total=total, daemons=daemons)
        )
    )
    assert "workspaces with work: 3 (the 2 busiest listed)" in text and "owned: as 1 daemons read say" in text
    assert "http://d2:9464/status: URLError refused" in text
    assert "workspaces with work: none" in _render(fmt.status_view(StatusReport(None, (), None, 0, (), 0)))


def test_the_share_served_is_each_workspaces_part_of_the_tasks_taken_lately() -> None:
    daemons = DaemonsOwned({"A": 2}, 2, served={"A": 30, "B": 10}, served_total=50)
    lines, _ = busiest_workspaces(COUNTS, daemons)
    by_id = {line.workspace_id: line for line in lines}
    assert by_id["A"].served == 0.6 and by_id["B"].served == 0.2 and by_id["D"].served == 0
    data = workspaces_json(lines, len(lines), daemons)
    assert {w["workspace_id"]: w["served"] for w in data["workspaces"]}["A"] == 0.6
    rendered = _render(workspaces_view(lines, len(lines), daemons))
    assert "served" in rendered and "60 %" in rendered
    # No daemon said (none read, or older ones): no column.
    assert "served" not in _render(workspaces_view(lines, len(lines), DaemonsOwned({"A": 2}, 1)))
