"""The torch fast path of the pickle VM: the byte pattern of the opcode sequence torch.save writes
for one dense tensor, and the helpers that decode its small integers, tuples and memo puts. The VM
(`pickle_vm._VM.torch_tensor`, or the compiled `_torchstep`) runs a match as one step; this module
only recognises and decodes, it changes no state.
"""
from __future__ import annotations

import re
import struct



# rebuild function to the REDUCE that calls it (protocol 2; protocol 4's SHORT_BINUNICODE and
# MEMOIZE too):
#   ( ( GET'storage' GET<class> X<key> PUT GET<location> INT<numel> t PUT Q
#   INT<offset> <size> PUT <stride> PUT NEWFALSE|NEWTRUE GET<OrderedDict> ) R PUT t PUT R
# `_VM.torch_tensor` runs a match as one step with exactly the effects of its 28-odd opcodes one
# by one (memo, stack, calls, persistent ids, opcode and object counts, where a failure is
# placed); anything else (another layout, memo indices out of order, a key that is not digits)
# is left to the opcode loop. A regex match costs less than dispatching those opcodes.
_GET = rb"(h.|j....)"
_PUT = rb"(q.|r....|\x94)"
_INT = rb"(K.|M..|J....)"
_SMALL_TUPLE = rb"(\)|(?:K.|M..|J....){1,3}[\x85-\x87]|\((?:K.|M..|J....){0,64}t)"
_TORCH_TENSOR = re.compile(
    rb"\(\(" + _GET + _GET + rb"(?:X(.)\x00\x00\x00|\x8c(.))([0-9]{1,19})" + _PUT + _GET
    + _INT + rb"t" + _PUT + rb"Q" + _INT + _SMALL_TUPLE + _PUT + _SMALL_TUPLE + _PUT
    + rb"([\x88\x89])" + _GET + rb"\)R" + _PUT + rb"t" + _PUT + rb"R", re.DOTALL)
_MEMOIZE6 = b"\x94" * 6
_BINPUT6 = struct.Struct("<" + "BB" * 6)
_LONG_BINPUT6 = struct.Struct("<" + "BI" * 6)
_INT_WIDTH = {0x4b: 2, 0x4d: 3, 0x4a: 5}     # BININT1, BININT2, BININT with their argument
_TUPLE_ARITY = {0x85: 1, 0x86: 2, 0x87: 3}   # TUPLE1..3
_SMALL_TUPLES: dict[bytes, tuple[tuple | None, int]] = {}   # opcode bytes -> (tuple, opcodes)


def _small_int(arg: bytes) -> int:
    """The value of a BININT1/BININT2/BININT opcode with its argument."""
    if arg[0] == 0x4b:
        return arg[1]
    return int.from_bytes(arg[1:], "little", signed=arg[0] == 0x4a)


def _puts_in_order(n: int, puts: bytes) -> bool:
    """True when ``puts`` are six MEMOIZEs, BINPUTs or LONG_BINPUTs to memo indices n .. n+5."""
    if len(puts) == 30:
        return puts == _LONG_BINPUT6.pack(0x72, n, 0x72, n + 1, 0x72, n + 2, 0x72, n + 3,
                                          0x72, n + 4, 0x72, n + 5)
    if len(puts) == 12:
        return n + 5 < 256 and puts == _BINPUT6.pack(0x71, n, 0x71, n + 1, 0x71, n + 2,
                                                     0x71, n + 3, 0x71, n + 4, 0x71, n + 5)
    return puts == _MEMOIZE6


def _small_tuple(arg: bytes) -> tuple[tuple | None, int]:
    """(the tuple a `_SMALL_TUPLE` match builds, its opcode count); the tuple is None when a
    TUPLEn takes more or fewer items than were pushed (not a plain size: the loop runs it).
    Shared: every [4, 4] of a checkpoint is one tuple object."""
    known = _SMALL_TUPLES.get(arg)
    if known is not None:
        return known
    items = []
    at = 1 if arg[0] == 0x28 else 0     # MARK ... TUPLE
    while arg[at] in _INT_WIDTH:
        width = _INT_WIDTH[arg[at]]
        items.append(_small_int(arg[at:at + width]))
        at += width
    arity = _TUPLE_ARITY.get(arg[-1])
    if arg[0] == 0x29:                  # EMPTY_TUPLE
        known = ((), 1)
    elif arity is None:
        known = (tuple(items), len(items) + 2)
    else:
        known = (tuple(items) if arity == len(items) else None, len(items) + 1)
    if len(_SMALL_TUPLES) < 4096:
        _SMALL_TUPLES[arg] = known
    return known
