"""How the open in progress reads: a listing (`formats.open_model(..., listing=True)`) or a full
open. Below both the dispatcher that sets it and the parsers that read it."""
from __future__ import annotations

import contextvars
from contextlib import contextmanager

# Listing mode, set by `tensorscope.formats.open_model(..., listing=True)` for the extent of
# that one call (the shards a sharded index opens inside it inherit it), never by an
# application: what `open()` returns depends on its arguments alone.
_LISTING = contextvars.ContextVar("tensorscope_listing", default=False)


@contextmanager
def listing_mode(on: bool):
    """For `formats.open_model` only: within it, a torch zip model keeps its tensors, metadata,
    anomalies and the globals its pickles import, but neither the object tree (``model.objects``
    is None) nor the per-call evidence (each pickle result's ``calls`` and ``persistent_ids``,
    never recorded), and a torch zip's archive lets go of its members once the storages can be
    found without them: ~1 KB less per tensor at the parse's peak, for commands that list or
    compare (inspect, diff). A scan needs that evidence: such a model must not be scanned, and
    the lists not kept (`pickle_vm.NotRecorded`) raise when read rather than look empty."""
    token = _LISTING.set(bool(on))
    try:
        yield
    finally:
        _LISTING.reset(token)


def listing_only_active() -> bool:
    """Whether the open in progress is a listing (`formats.open_model`'s ``listing``)."""
    return _LISTING.get()
