"""The first screen of a sharded checkpoint comes after its first shard, not its last.

A checkpoint of 10^6 tensors in ten shards takes seconds to read whole. The app opens it with
`tensorscope.formats.open_model_by_shard`, which hands over each shard as soon as it is parsed:
the first becomes the model on screen (a `ModelFile` of the shards read so far, its tensors in the
order they were read), and each later one is appended to it on the UI thread (`add`), with its
table index made off the UI thread (`model_index.index_chunk`). When the open returns, the whole
model replaces the growing one (`complete`): the same records, in the model's own order (an index
file's, which may differ from the shards'), with its checks and evidence. The tree, the name
groups and the scan wait for the whole model.
"""
from __future__ import annotations

import operator

from tensorscope import ModelFile

from .model_index import TensorIndex, index_chunk

__all__ = ["ShardStream"]


class ShardStream:
    """The model on screen while its shards are still being read."""

    def __init__(self, path: str, total: int):
        self.model = ModelFile("sharded", path, files=[])
        self.total = total
        self.done = 0          # shards taken in by the model on screen
        self.read = 0          # shards parsed (opener thread)
        self.lists: list = []  # each shard's tensor list, in the order read (opener thread)
        self.index: TensorIndex | None = None

    def first(self, shard: ModelFile) -> None:
        """The first shard, on the opener thread, before anything is shown."""
        self.lists.append(shard.tensors)
        self.read = 1
        self.add(shard)
        self.index = TensorIndex(self.model.tensors)

    def parsed(self, shard: ModelFile) -> tuple:
        """A later shard, on the opener thread: its table index (handed to `add` on the UI
        thread with the shard)."""
        self.lists.append(shard.tensors)
        self.read += 1
        return index_chunk(shard.tensors)

    def add(self, shard: ModelFile, chunk: tuple | None = None) -> bool:
        """Append a shard to the model on screen (UI thread, after the first); True when a table
        column got wider."""
        m = self.model
        m.files.extend(f for f in shard.files if f not in m.files)
        m.sources.update(shard.sources)
        m.custom_readers.update(shard.custom_readers)
        m.tensors.extend(shard.tensors)
        self.done += 1
        return self.index.extend(chunk) if chunk is not None else False

    def release(self) -> None:
        """The whole model is on screen: let go of the growing one's lists (8 bytes a tensor each)."""
        self.model.tensors = []
        self.lists = []

    def index_of(self, model: ModelFile) -> TensorIndex | None:
        """On the opener thread, once the whole ``model`` is read: None when its records are the
        ones shown, in the order shown (the index of the model on screen serves it), else its own
        index (an index file's order, or checks that dropped or added records)."""
        shown = [t for lst in self.lists for t in lst]
        if len(shown) == len(model.tensors) and all(map(operator.is_, shown, model.tensors)):
            return None
        return TensorIndex(model.tensors)
