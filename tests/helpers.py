"""Helpers that several test modules share: the optional torch oracle and its skip marker, dtype names, and a
call of a primitive in a hand-built graph."""
from __future__ import annotations

import pytest

try:
    import torch
except ImportError:  # the oracle is optional: tests that compare with it skip, the rest still run
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch (the oracle) is not installed")


def require_torch():
    """The real torch; where it is not installed, skips the calling test from here on (checks made before stand).
    A test that needs torch from its start takes the `torch` fixture (conftest.py) instead."""
    if torch is None:
        pytest.skip("torch (the oracle) is not installed")
    return torch


def dname(dtype) -> str:
    """'float32' for runtime.float32 and torch.float32 alike."""
    return str(dtype).split(".")[-1]


def call(g, name, *args, **attrs):
    """A call_function node of the primitive `name` in graph g (attrs become its kwargs)."""
    from nnc.prims import prims

    return g.call_function(prims[name], args, attrs)
