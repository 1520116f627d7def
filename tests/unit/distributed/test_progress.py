"""The progress board and the driver's tracker, driven by a fake clock (no Ray)."""

from __future__ import annotations

from draftdata.distributed.progress import LOST, Board, Tracker, headline, plain_line


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_board_counts_attempts_and_keeps_a_killed_attempts_commits() -> None:
    clock = Clock()
    board = Board([10, 10], clock=clock)
    board.started(0, "node-a", 111, "w1")
    board.update(0, "w1", committed=4, failed=1, tokens=400)
    # The worker was killed: Ray's retry reports a new attempt on another node.
    board.started(0, "node-b", 222, "w2")
    part = board.snapshot()[0]
    assert part.attempts[0].error == LOST  # the driver recounts w1's shards once
    board.update(0, "w1", committed=5, failed=1, tokens=500)  # that recount
    board.update(0, "w2", committed=5, failed=0, tokens=500)
    board.update(0, "nobody", committed=99, failed=0, tokens=0)  # unknown writer: ignored
    part = board.snapshot()[0]
    assert part.committed == 10
    assert part.node == "node-b"
    assert board.pids(0) == [111, 222]
    board.finished(0, "w2", {"completed": 5})
    assert board.snapshot()[0].state == "done"
    board.started(1, "node-a", 333, "w3")
    board.crashed(1, "w3", "fleet-x.yaml: not found")
    assert board.snapshot()[1].state == "failed"
    assert board.snapshot()[1].attempts[0].error == "fleet-x.yaml: not found"
    board.reset([5])
    assert [p.state for p in board.snapshot()] == ["queued"]


def test_tracker_rates_per_node_and_eta() -> None:
    clock = Clock()
    board = Board([100, 100], clock=clock)
    tracker = Tracker(total=200, window_s=30.0, clock=clock)
    board.started(0, "node-a", 1, "w1")
    board.started(1, "node-b", 2, "w2")
    tracker.observe(board.snapshot())
    for step in range(1, 4):
        clock.t += 10
        board.update(0, "w1", committed=20 * step, failed=0, tokens=2000 * step)
        board.update(1, "w2", committed=10 * step, failed=0, tokens=1000 * step)
        tracker.observe(board.snapshot())
    rows = {r.node: r for r in tracker.nodes()}
    assert rows["node-a"].rate == 2.0 and rows["node-b"].rate == 1.0
    assert rows["node-a"].token_rate == 200.0
    assert tracker.committed == 90
    assert tracker.eta_s() == (200 - 90) / 3.0
    line = plain_line(tracker)
    assert line.startswith("ray generate: 90/200 committed, 3.0/s, 300 tok/s, ETA 0m36s")
    assert "node-a 2.0/s 200 tok/s" in line and "2 running" in headline(tracker)


def test_tracker_without_a_total_has_no_eta() -> None:
    tracker = Tracker(total=None, clock=Clock())
    tracker.observe([])
    assert tracker.eta_s() is None
    assert "ETA ?" in plain_line(tracker)


def test_render_draws_one_row_per_node() -> None:
    from rich.console import Console

    from draftdata.distributed.progress import render

    clock = Clock()
    board = Board([10, 10], clock=clock)
    tracker = Tracker(total=20, clock=clock)
    board.started(0, "gpu-a", 1, "w1")
    board.started(1, "gpu-b", 2, "w2")
    tracker.observe(board.snapshot())
    clock.t += 10
    board.update(0, "w1", committed=10, failed=0, tokens=1500)
    board.finished(0, "w1", {})
    tracker.observe(board.snapshot())
    console = Console(width=100, record=True)
    console.print(render(tracker))
    text = console.export_text()
    assert text.splitlines()[0].startswith("ray generate: 10/20 committed, 1.0/s, 150 tok/s")
    rows = {line.split()[0]: line.split() for line in text.splitlines()[2:] if line.strip()}
    assert rows["gpu-a"][1:5] == ["0", "1", "10", "1.0"]  # running, done, committed, req/s
    assert rows["gpu-b"][1:4] == ["1", "0", "0"]
