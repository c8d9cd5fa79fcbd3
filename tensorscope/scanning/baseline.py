"""Baselines: a gate that fails only on what is new.

``--write-baseline FILE`` writes the scan's JSON report (schema ``tensorscope.scan/1``, every
finding, the suppressed ones included) plus ``"hashes": {file: sha256}`` of each file with a
finding. ``--baseline FILE`` then accepts a finding when the baseline holds one with the same
rule and location (archive member, byte offset) in a file with the same content hash: a file whose
bytes changed is judged again in full, a file moved or renamed unchanged keeps its accepted
findings. Accepted findings are reported as suppressed (kind ``baseline``), never dropped.

Identity of a file: the sha256 of its bytes (one read at disk speed, only for files that have a
finding); a symlink the walk did not follow, by its target's text; a URL by its ETag/version.
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable

from .report import Finding
from .settings import SettingsError, Suppression

__all__ = ["BASELINE_KEY", "Baseline", "file_identity", "write_baseline"]

BASELINE_KEY = "hashes"
_BUF = 1 << 20


def file_sha256(path: str) -> str:
    """sha256 of a file's bytes, read once at disk speed with flat memory: 1 MiB ``readinto``
    blocks into one buffer, each hashed while it is still in cache (hashing through a map, or a
    16 MiB buffer, measured 1.2-1.4x the CPU: the hash then reads every byte from memory)."""
    import hashlib
    h = hashlib.sha256()
    buf = bytearray(_BUF)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)  # longer readahead
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])
    return h.hexdigest()


def file_identity(path: str, follow: bool = True) -> str | None:
    """What says a file still holds the bytes a baseline accepted (see the module doc);
    ``follow=False`` for a symlink the walk reported instead of following."""
    from ..remote import is_url
    if is_url(path):
        from .identity import identity
        version = identity(path).get("version")
        return f"version:{version}" if version else None
    try:
        if not follow and os.path.islink(path):
            return "symlink:" + os.readlink(path)
        if not os.path.isfile(path):
            return None
        return "sha256:" + file_sha256(path)
    except OSError:
        return None


def finding_identity(f: Finding, identity: Callable[[str], str | None]) -> str | None:
    """The identity of the file a finding is about: a link the walk did not follow is its
    target's text, never the bytes behind it."""
    if f.rule == "file.symlink-outside":
        return file_identity(f.file, follow=False)
    return identity(f.file)


def _key(ident: str, f: Finding) -> tuple:
    return ident, f.rule, f.member, f.offset


class Baseline:
    """The accepted findings of a baseline report; `accept` is `apply_settings`' ``accept``."""

    def __init__(self, path: str, identities: dict[str, str] | None = None):
        self.path = path
        try:
            with open(path, encoding="utf-8") as fh:
                doc = json.load(fh)
        except FileNotFoundError:
            raise SettingsError(f"{path}: no such baseline") from None
        except (OSError, ValueError) as e:
            raise SettingsError(f"{path}: not a JSON scan report: {e}") from None
        if not isinstance(doc, dict) or doc.get("schema") != "tensorscope.scan/1":
            raise SettingsError(f"{path}: not a tensorscope scan report (schema tensorscope.scan/1)")
        hashes = doc.get(BASELINE_KEY)
        if not isinstance(hashes, dict):
            raise SettingsError(f"{path}: the report has no file hashes: write it with "
                                f"--write-baseline FILE")
        self.keys: set[tuple] = set()
        for d in [*doc.get("findings", ()), *doc.get("suppressed", ())]:
            try:
                f = Finding.from_dict(d)
            except (KeyError, TypeError, ValueError) as e:
                raise SettingsError(f"{path}: a finding that does not read back: {e}") from None
            ident = hashes.get(f.file)
            if isinstance(ident, str):
                self.keys.add(_key(ident, f))
        self.rules = {k[1] for k in self.keys}
        self._ids: dict[str, str | None] = dict(identities or {})
        self.suppression = Suppression("*", None, f"in the baseline {os.path.basename(path)}",
                                       f"--baseline {path}", kind="baseline")

    def identity(self, path: str) -> str | None:
        if path not in self._ids:
            self._ids[path] = file_identity(path)
        return self._ids[path]

    def accept(self, f: Finding) -> Suppression | None:
        if f.rule not in self.rules:   # no read at all for a rule the baseline never saw
            return None
        ident = finding_identity(f, self.identity)
        if ident is None or _key(ident, f) not in self.keys:
            return None
        return Suppression(f.rule, f.file, self.suppression.reason, self.suppression.source,
                           kind="baseline")


def write_baseline(path: str, doc: dict[str, Any], findings: list[Finding],
                   identity: Callable[[str], str | None] = file_identity) -> None:
    """Write ``doc`` (a JSON report) with the identity of every file that has a finding."""
    hashes: dict[str, str] = {}
    for f in findings:
        if f.file not in hashes:
            ident = finding_identity(f, identity)
            if ident is not None:
                hashes[f.file] = ident
    out = {**doc, BASELINE_KEY: hashes}
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(out, fh, indent=1, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)
