"""The sandbox's pure rules, without servers: the lifecycle table, identities and markers, paths,
and the operation log's wrapper, which is run here by a real shell to show that it starts a
command once however often it is launched."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from hands.sandbox.rules import oplog
from hands.sandbox.rules.binding import (
    PRIVATE,
    Definition,
    Found,
    binding_id,
    identity,
    judge,
    labels,
    marker_problem,
    may_use,
)
from hands.sandbox.rules.errors import SandboxForbiddenError
from hands.sandbox.rules.paths import inside, user_path
from hands.sandbox.rules.states import SandboxStatus as S
from hands.sandbox.rules.states import transition
from protocol import IllegalTransitionError, SchemaError


def test_only_a_reconcile_leaves_an_unknown_creation_and_only_a_deleted_binding_is_made_again() -> None:
    assert transition(S.CREATING, S.READY) is S.READY
    for new in (S.READY, S.FAILED):
        with pytest.raises(IllegalTransitionError, match="reconcile-creation"):
            transition(S.UNKNOWN, new)
        assert transition(S.UNKNOWN, new, reconcile=True) is new
    assert transition(S.DELETED, S.CREATING) is S.CREATING
    for old in (S.READY, S.UNKNOWN, S.FAILED, S.DELETING):
        with pytest.raises(IllegalTransitionError):
            transition(old, S.CREATING)
    with pytest.raises(IllegalTransitionError):
        transition(S.DELETED, S.READY)
    for old in (S.CREATING, S.READY, S.UNKNOWN, S.FAILED):
        assert transition(old, S.DELETING) is S.DELETING


def test_a_binding_is_its_sessions_own_or_a_named_one_of_its_namespace() -> None:
    assert binding_id("s1", None) == PRIVATE + "s1"
    assert binding_id("s1", "team") == "team"
    for bad in ("session:s2", "../x", "", "a b", "x" * 101):
        with pytest.raises(SchemaError):
            binding_id("s1", bad)
    may_use("team", "s1", "s2")
    may_use(PRIVATE + "s1", "s1", "s1")
    with pytest.raises(SandboxForbiddenError):
        may_use(PRIVATE + "s1", "s1", "s2")


def test_identities_differ_by_namespace_binding_and_generation_and_are_provider_names() -> None:
    names = {identity(ns, b, g) for ns in ("a", "b") for b in ("x", "y") for g in (1, 2)}
    assert len(names) == 8
    assert all(n.startswith("tendon-sbx-") and n.replace("-", "").isalnum() for n in names)
    assert identity("a", "x", 1) == identity("a", "x", 1)


def test_only_this_bindings_labels_and_marker_count_as_its_sandbox() -> None:
    mine = labels("ns", "b", "nonce-1", "id-1")
    assert judge(None, mine) is Found.NOTHING
    assert judge({**mine, "other.label": "x"}, mine) is Found.OURS
    assert judge({}, mine) is Found.FOREIGN
    assert judge({**mine, "io.tendon.sandbox.nonce": "nonce-2"}, mine) is Found.FOREIGN
    assert marker_problem(dict(mine), mine) is None
    assert "missing" in str(marker_problem(None, mine))
    assert "another sandbox" in str(marker_problem({**mine, "io.tendon.sandbox.nonce": "x"}, mine))
    assert "another sandbox" in str(marker_problem("garbage", mine))


def test_a_definition_version_follows_its_configuration() -> None:
    one = Definition("default", {"backend": "docker", "image": "python:3.11-slim"})
    assert one.version == Definition("default", {"image": "python:3.11-slim", "backend": "docker"}).version
    assert one.version != Definition("default", {"backend": "docker", "image": "debian:bookworm"}).version


def test_workspace_paths_stay_inside_and_tools_never_touch_the_record() -> None:
    assert inside("a/./b/../c.txt") == "a/c.txt"
    assert inside("/workspace/src/x.py") == "src/x.py"
    assert inside(".tendon/marker.json") == ".tendon/marker.json"
    for bad in ("/etc/passwd", "../x", "a/../../x", ".", "", "a\x00b"):
        with pytest.raises(SchemaError):
            inside(bad)
    for record in (".tendon", ".tendon/ops/x/exit", "a/../.tendon/marker.json"):
        with pytest.raises(SchemaError, match="own record"):
            user_path(record)


def test_the_probe_reading_is_strict() -> None:
    assert oplog.read_probe("none\nsize 0\n") == oplog.OpState(oplog.Phase.NONE, 0)
    assert oplog.read_probe("exit 3\nsize 12\n") == oplog.OpState(oplog.Phase.FINISHED, 12, 3)
    assert oplog.read_probe("running\nsize 5\n").phase is oplog.Phase.RUNNING
    for bad in ("", "running\n", "weird\nsize 1\n"):
        with pytest.raises(ValueError):
            oplog.read_probe(bad)
    result = oplog.outcome(oplog.OpState(oplog.Phase.FINISHED, 3, oplog.TIMED_OUT), "abc")
    assert result == {"exit_code": 124, "timed_out": True, "output_bytes": 3, "output": "abc"}


def _sh(script: str, cwd: Path) -> str:
    return subprocess.run(["sh", "-c", script], cwd=cwd, capture_output=True, text=True, check=True).stdout


def test_the_wrapper_starts_a_command_once_however_often_it_is_launched(tmp_path: Path) -> None:
    op = "exec-1"
    d = tmp_path / oplog.op_dir(op)
    d.mkdir(parents=True)
    (d / "cmd").write_text("echo run >> starts.txt; echo out; sleep 1; exit 5")
    (d / "run.sh").write_text(oplog.wrapper(op, 30))
    assert oplog.read_probe(_sh(oplog.probe(op), tmp_path)).phase is oplog.Phase.NONE
    for _ in range(3):  # a start sent again, a worker re-attaching...
        _sh(oplog.launch(op), tmp_path)
    deadline = time.monotonic() + 10
    while (state := oplog.read_probe(_sh(oplog.probe(op), tmp_path))).phase is not oplog.Phase.FINISHED:
        # NONE while the detached wrapper has not taken its lock yet
        assert state.phase in (oplog.Phase.NONE, oplog.Phase.STARTING, oplog.Phase.RUNNING), state
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert state == oplog.OpState(oplog.Phase.FINISHED, 4, 5)
    assert (tmp_path / "starts.txt").read_text() == "run\n"
    _sh(oplog.launch(op), tmp_path)  # after its end: nothing runs again
    time.sleep(0.2)
    assert (tmp_path / "starts.txt").read_text() == "run\n"


def test_a_wrapper_killed_without_an_exit_code_reads_as_lost(tmp_path: Path) -> None:
    op = "exec-2"
    d = tmp_path / oplog.op_dir(op)
    d.mkdir(parents=True)
    (d / "cmd").write_text("sleep 30")
    (d / "run.sh").write_text(oplog.wrapper(op, 60))
    _sh(oplog.launch(op), tmp_path)
    deadline = time.monotonic() + 10
    while oplog.read_probe(_sh(oplog.probe(op), tmp_path)).phase is not oplog.Phase.RUNNING:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # The wrapper first: killed after its command, it would still write the exit code
    _sh(f"kill -9 $(cat {oplog.op_dir(op)}/pid); " + oplog.stop(op, "KILL"), tmp_path)
    while (phase := oplog.read_probe(_sh(oplog.probe(op), tmp_path)).phase) is oplog.Phase.RUNNING:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert phase is oplog.Phase.LOST


def test_a_command_that_ends_between_two_looks_is_never_read_as_lost(tmp_path: Path) -> None:
    # The probe looks at the wrapper before its exit file: an end in between is an end
    for n in range(30):
        op = f"quick-{n}"
        d = tmp_path / oplog.op_dir(op)
        d.mkdir(parents=True)
        (d / "cmd").write_text("true")
        (d / "run.sh").write_text(oplog.wrapper(op, 30))
        _sh(oplog.launch(op), tmp_path)
        deadline = time.monotonic() + 10
        while (state := oplog.read_probe(_sh(oplog.probe(op), tmp_path))).phase is not oplog.Phase.FINISHED:
            assert state.phase is not oplog.Phase.LOST, f"run {n} read as lost"
            assert time.monotonic() < deadline


def test_a_fenced_command_never_starts_and_a_started_one_cannot_be_fenced(tmp_path: Path) -> None:
    for op, command in (("never", "echo ran >> starts.txt"), ("started", "sleep 1")):
        d = tmp_path / oplog.op_dir(op)
        d.mkdir(parents=True)
        (d / "cmd").write_text(command)
        (d / "run.sh").write_text(oplog.wrapper(op, 30))
    assert _sh(oplog.fence("never"), tmp_path).strip() == "fenced"
    _sh(oplog.launch("never"), tmp_path)
    _sh(f"sh {oplog.op_dir('never')}/run.sh", tmp_path)  # a wrapper run to its end: it leaves at once
    assert oplog.read_probe(_sh(oplog.probe("never"), tmp_path)).phase is oplog.Phase.FENCED
    assert not (tmp_path / "starts.txt").exists()
    _sh(oplog.launch("started"), tmp_path)
    deadline = time.monotonic() + 10
    while oplog.read_probe(_sh(oplog.probe("started"), tmp_path)).phase is oplog.Phase.NONE:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert _sh(oplog.fence("started"), tmp_path).strip() == ""
    assert oplog.read_probe(_sh(oplog.probe("started"), tmp_path)).phase is not oplog.Phase.FENCED
