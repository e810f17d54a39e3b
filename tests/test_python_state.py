"""nnc.python_state: snapshots of the Python state a forward reaches, what counts as a change, and putting it back."""
from __future__ import annotations

import types

import nnc
import runtime
from nnc import python_state
from nnc.python_state import ReachableState
from runtime import nn


def test_changes_at_any_depth_are_named_and_put_back():
    config = types.SimpleNamespace(calls=0, seen={"a": [1]}, tags={"x"})
    state = ReachableState([("config", config)])
    config.calls += 1
    assert state.changed() == "config.calls"
    config.seen["a"].append(2)
    config.tags.add("y")
    assert state.restore()
    assert (config.calls, config.seen, config.tags) == (0, {"a": [1]}, {"x"})
    assert state.changed() is None and not state.restore()


def test_equal_plain_values_and_reads_are_no_change():
    config = types.SimpleNamespace(scale=2.5, name="gpt", items=[1, 2])
    state = ReachableState([("config", config)])
    config.scale = float("2.5")  # a new float object of the same value
    config.name = "".join(["g", "pt"])
    assert config.items[0] == 1 and state.changed() is None


def test_tensors_modules_and_own_objects_are_not_walked():
    """A tensor's data is functionalize's to track, a module has its own snapshot, and runtime's and nnc's objects
    (a GraphModule's graph, whose nodes shape propagation annotates) are not the model's state."""
    tensor, layer = runtime.zeros(2), nn.Linear(2, 2)
    gm = nnc.symbolic_trace(nn.Sequential(nn.ReLU()))
    state = ReachableState([("values", [tensor, layer, gm.graph])])
    tensor.add_(1)
    layer.extra = 1
    next(iter(gm.graph.nodes)).meta["mark"] = 1
    assert state.changed() is None and len(state.saved) == 1  # the list alone


def test_a_walk_stops_after_max_objects(monkeypatch):
    monkeypatch.setattr(python_state, "MAX_OBJECTS", 3)
    nested = [[[] for _ in range(5)]]
    assert len(ReachableState([("nested", nested)]).saved) == 3


def test_a_module_snapshot_leaves_out_its_registries_and_submodules():
    model = nn.Sequential(nn.Linear(2, 2))
    model.notes = {"runs": 0}
    state = ReachableState.of_module(model, "model")
    assert [path for path, _, _ in state.saved] == ["model.notes"]


COUNTER = 0
RECORD: list = []


def _bumps():
    global COUNTER
    COUNTER += 1
    RECORD.append([COUNTER])
    return [x for x in RECORD]  # a comprehension's code names globals too


def test_globals_a_function_names_are_watched_and_put_back():
    state = ReachableState.of_globals(_bumps)
    _bumps()
    assert state.changed() == "global COUNTER"
    assert state.restore() and (COUNTER, RECORD) == (0, [])


def test_standard_library_objects_other_than_namespaces_are_not_walked():
    import argparse
    import logging

    logger = logging.getLogger("nnc.tests.python_state")
    args, spaces = argparse.Namespace(lr=0.1), types.SimpleNamespace(step=0)
    state = ReachableState([("objects", [logger, args, spaces])])
    logger.isEnabledFor(logging.DEBUG)  # fills the logger's own cache
    assert state.changed() is None
    args.lr = 0.2
    assert state.changed() == "objects[1].lr"
