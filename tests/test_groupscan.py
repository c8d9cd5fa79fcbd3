"""The compiled grouping pass (tensorscope/_groupscan.c) against the Python loop
(`GroupCollector._add_tensors`): on the records of every fixture and on names made to stress the
index rule (empty components, leading zeros, digits inside words, non-ASCII, nested paths, data-
less records), the groups (order, counts, bytes, first names, index values) must be the same."""
from __future__ import annotations

import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tensorscope
from tensorscope import grouping
from tensorscope.grouping import GroupCollector
from tensorscope.model import TensorInfo
from torch_oracle import FIXTURES

needs_c = pytest.mark.skipif(grouping._SCAN is None, reason="the compiled pass is not built")


def _groups(records, compiled: bool):
    c = GroupCollector()
    if compiled:
        c.add_tensors(list(records))
    else:
        c._add_tensors(records)
    return list(c._groups.items()), list(c.groups())


def _same(records):
    got, want = _groups(records, True), _groups(records, False)
    assert got == want
    return got


def test_the_compiled_pass_is_built_where_a_compiler_is():
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler: the Python loop is the one in use")
    assert grouping._SCAN is not None, ("tensorscope/_groupscan.c is not built, or its build is "
                                        "stale (ABI): run pip install -e . again")


@needs_c
def test_every_fixture():
    records = []
    for path in sorted(p for p in FIXTURES.rglob("*") if p.is_file()):
        try:
            with tensorscope.open(path, listing=True) as m:
                records.extend(m.tensors)
        except Exception:   # noqa: BLE001  (not a model, or a broken one)
            continue
    assert len(records) > 500
    _same(records)
    _same(records[::-1])


def _t(name, path=None, shape=(4,), has_data=True, dtype="float32"):
    return TensorInfo(name, dtype, shape, path=path or (), has_data=has_data)


NAMES = ["model.layers.0.mlp.experts.7.up_proj.weight", "model.layers.10.mlp.experts.07.up_proj.weight",
         "a..1", "1.2", "", ".", "a.1.", ".1", "layer1.conv2.w0", "h.0.attn.c_attn.weight", "0",
         "12345678901234567890123.x", "é.1.w", "a.1b.2", "a.-1.b", "x." * 40 + "1", "9." * 40]


@needs_c
def test_stress_names():
    records = [_t(n) for n in NAMES] + [_t(n, shape=(2, 2)) for n in NAMES]
    records += [_t("outer", path=("outer.0", "in.1")), _t("p", path=("p.3",)),
                _t("x.1.y", has_data=False), _t("x.2.y"), _t("x.3.y", dtype="float16")]
    _same(records)
    _same(records * 3)


@needs_c
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.from_regex(r"([a-z]{0,3}|[0-9]{1,3}|é)(\.([a-z]{0,3}|[0-9]{1,3})){0,4}",
                                        fullmatch=True),
                          st.sampled_from([(4,), (2, 2)]), st.booleans()), max_size=40))
def test_generated_names(items):
    _same([_t(n, shape=s, has_data=h) for n, s, h in items])
