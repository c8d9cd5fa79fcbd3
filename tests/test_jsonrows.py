"""The compiled rows of `inspect --json` (tensorscope/_jsonrows.c) against the Python loop
(`model._json_texts`): on the records of every fixture of every format and on records made to
stress each step (escapes, non-ASCII names, torch storage extras, ints past 2^63, fields of other
types, kinds changing row by row), `json_texts` must give the Python loop's texts, which must be
what the JSON encoder writes for `to_dict`."""
from __future__ import annotations

import json
import shutil

import pytest

import tensorscope
from tensorscope import model as M
from tensorscope.model import FrozenDict, TensorInfo
from torch_oracle import FIXTURES

needs_c = pytest.mark.skipif(M._ROWS_C is None, reason="the compiled loop is not built")
ENCODE = json.JSONEncoder(sort_keys=True).encode


def _every_fixture_record():
    records = []
    for path in sorted(p for p in FIXTURES.rglob("*") if p.is_file()):
        try:
            with tensorscope.open(path, listing=True) as m:
                records.extend(m.tensors)
        except Exception:   # noqa: BLE001  (not a model, or a broken one: no records)
            continue
    return records


def _check(records):
    records = list(records)
    got, want = M.json_texts(records), M._json_texts(records)
    assert got == want
    for t, text in zip(records, got):
        if text is not None:
            assert text == ENCODE(t.to_dict())
    joined = M.json_texts_joined(records)
    assert joined is None or (None not in got and joined == ", ".join(got))
    return got


def test_the_compiled_loop_is_built_where_a_compiler_is():
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler: the Python loop is the one in use")
    assert M._ROWS_C is not None, ("tensorscope/_jsonrows.c is not built, or its build is stale "
                                   "(ABI): run pip install -e . again")
    import dataclasses
    assert tuple(f.name for f in dataclasses.fields(TensorInfo)) == M._ROWS_C.FIELDS


@needs_c
def test_every_fixture():
    records = _every_fixture_record()
    assert len(records) > 500
    assert {t.source_format for t in records} >= {"safetensors", "torch-zip", "gguf", "onnx"}
    assert sum(isinstance(t.extras.get("member"), str) for t in records) > 100   # storage kinds
    _check(records)
    _check(records[::-1])      # kinds in another order
    _check(records[::3])


def _info(name="a.b", **kw):
    base = dict(name=name, dtype="float16", shape=(4, 4), byte_offset=8, file="f.safetensors",
                source_format="safetensors", extras=FrozenDict(safetensors_dtype="F16",
                                                               header_shape=(4, 4)))
    base.update(kw)
    return TensorInfo(**base)


def _member(name, member, location="cpu", **kw):
    return _info(name, source_format="torch", storage_key=member.rsplit("/", 1)[-1],
                 extras=FrozenDict(location=location, member=member), **kw)


@needs_c
def test_joined_where_every_row_is_compiled():
    shared = FrozenDict(safetensors_dtype="F16", header_shape=(4, 4))
    plain = [_info(f"m.{i}.w", byte_offset=8 + 32 * i, extras=shared) for i in range(5)]
    assert M.json_texts_joined(plain) == ", ".join(M._json_texts(plain))
    assert M.json_texts_joined([]) == ""
    assert M.json_texts_joined(plain + [_info("no-data", has_data=False)]) is None   # encoder's
    escaped = plain + [_info("\u00e9\n", extras=shared)]     # escaped by the encoder's function
    assert M.json_texts_joined(escaped) == ", ".join(M._json_texts(escaped))

    class Sub(str):
        pass
    odd = _info("x", extras=shared)
    object.__setattr__(odd, "name", Sub("x"))
    assert M.json_texts_joined(plain + [odd]) is None                     # the row is Python's
    storage = [_member(f"t.{i}", f"archive/data/{i}") for i in range(3)]
    assert M.json_texts_joined(storage) == ", ".join(M._json_texts(storage))


@needs_c
def test_stress_records():
    shared = FrozenDict(safetensors_dtype="F16", header_shape=(4, 4))
    records = [
        _info("plain", extras=shared), _info("plain.2", extras=shared, byte_offset=40),
        _info('quote"back\\slash', extras=shared), _info("tab\tnew\nline\x1b", extras=shared),
        _info("\u00e9t\u00e9 \u4e2d \U0001f600", extras=shared), _info("\u202egnp.exe", extras=shared),
        _info("del\x7f", extras=shared),
        _info("big", byte_offset=2 ** 63 + 5, extras=shared),
        _info("huge", byte_offset=2 ** 70, extras=shared),
        _info("none", byte_offset=None, extras=shared),
        _info("neg", byte_offset=-3, extras=shared),
        _info("nested", path=("outer.x", "in\"ner", "\u00e9"), extras=shared),
        _info("other", path=("other",), extras=shared),
        _info("diff-path", path=("different",), extras=shared),
        _member("t.0", "archive/data/0"), _member("t.1", "archive/data/1"),
        _member("t.2", "archive/data/\u00e92"), _member("t.3", "archive/data/3", location="cuda:0"),
        _member("t.4", "archive/data/4", storage_offset=7),
        _info("no-data", has_data=False), _info("empty-extras", extras={}),
        _info("float-extras", extras={"scale": 0.5}),
        _info("list-extras", extras={"dims": [1, 2], "names": ["a", "b"]}),
        _info("key", storage_key="k\u00e9y", extras=shared),
        _info("shape2", shape=(2, 8), extras=shared), _info("plain.3", extras=shared),
    ]
    _check(records)
    _check(records[::-1])
    _check([r for r in records for _ in range(3)])


@needs_c
def test_odd_field_types_go_to_python():
    shared = FrozenDict(safetensors_dtype="F16", header_shape=(4, 4))
    a = _info("a", extras=shared)
    odd = []
    for field, value in (("byte_offset", True), ("byte_offset", 8.0), ("storage_offset", None),
                         ("path", ["a"]), ("path", ("a", 1)), ("name", 5), ("storage_key", 3),
                         ("nbytes", True)):
        t = _info("b", extras=shared)
        object.__setattr__(t, field, value)
        odd.append(t)
    records = [a, *odd, a]
    assert M.json_texts(records) == M._json_texts(records)

    class Sub(str):
        pass
    t = _info("c", extras=shared)
    object.__setattr__(t, "name", Sub("c"))
    assert M.json_texts([a, t, a]) == M._json_texts([a, t, a])


@needs_c
def test_bind_refuses_a_class_without_the_slots():
    class NotInfo:
        __slots__ = ("name",)
    with pytest.raises(TypeError):
        M._ROWS_C.bind(NotInfo, FrozenDict)
    with pytest.raises(TypeError):
        M._ROWS_C.bind(TensorInfo, list)
    assert M.json_texts([_info()]) == M._json_texts([_info()])
