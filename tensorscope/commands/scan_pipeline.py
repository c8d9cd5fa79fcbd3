"""`tensorscope scan` in pipelines: the flags of configuration, suppressions, baselines, the
SBOM and ``--output``, and the step that turns a scan's report into the judged one
(`tensorscope.scanning.settings`, `.baseline`, `.sbom`). Kept apart from `commands.scan` so that the
gate's logic reads in one place."""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

from ..render import error_line

__all__ = ["add_arguments", "Pipeline"]


def add_arguments(p) -> None:
    g = p.add_argument_group("pipelines (configuration, suppressions, baselines, SBOM)")
    g.add_argument("--config", metavar="FILE",
                   help="read [tool.tensorscope.scan] (pyproject.toml) or [scan] (tensorscope.toml) "
                        "from FILE (default: the nearest one from the scanned path upwards)")
    g.add_argument("--no-config", action="store_true", help="read no configuration file")
    g.add_argument("--ignore", action="append", default=[], metavar="RULE[:GLOB]",
                   help="accept RULE (everywhere, or in the files GLOB matches); repeatable. "
                        "A critical finding is hidden only when GLOB names its file literally")
    g.add_argument("--severity", action="append", default=[], metavar="RULE=LEVEL",
                   help="report RULE at LEVEL (never lowers a critical finding); repeatable")
    g.add_argument("--baseline", metavar="REPORT.json",
                   help="fail only on findings not in this report (written by --write-baseline): "
                        "matched by file hash, rule and location")
    g.add_argument("--write-baseline", metavar="FILE",
                   help="write this scan's findings, with the hashes of their files, as a baseline")
    g.add_argument("--sbom", metavar="FILE",
                   help="write a CycloneDX 1.6 ML-BOM (JSON) of the files scanned "
                        "(needs tensorscope[sbom])")
    g.add_argument("--output", "-o", metavar="FILE",
                   help="write the report (table, --json or --sarif) to FILE instead of stdout")


class Pipeline:
    """The settings a scan runs under (`prepare`), then the judged report (`judge`)."""

    def __init__(self, args, settings, baseline):
        self.args = args
        self.settings = settings
        self.baseline = baseline
        self.inventories: dict[str, dict[str, Any]] = {}

    @classmethod
    def prepare(cls, args) -> "Pipeline | int":
        """The settings, or the exit status 2 after one error line."""
        from ..scanning.settings import SettingsError, load_settings
        try:
            settings = load_settings(paths=list(args.paths), config=args.config,
                                     isolated=args.no_config, ignores=args.ignore,
                                     severities=args.severity)
            baseline = None
            if args.baseline:
                from ..scanning.baseline import Baseline
                baseline = Baseline(args.baseline)
            if args.sbom:
                import importlib.util
                if importlib.util.find_spec("cyclonedx") is None:
                    raise SettingsError("--sbom needs cyclonedx-python-lib: pip install "
                                        "'tensorscope[sbom]'")
        except SettingsError as e:
            return error_line("scan", str(e))
        return cls(args, settings, baseline)

    @property
    def inventory(self) -> bool:
        return bool(self.args.sbom)

    def on_record(self, rec: dict[str, Any]) -> None:
        if rec.get("inventory") is not None:
            self.inventories[rec["path"]] = rec["inventory"]

    def fail_on(self) -> str:
        if self.args.fail_on:
            return self.args.fail_on
        return str(self.settings.fail_on) if self.settings.fail_on is not None else "medium"

    def judge(self, report):
        """The report after suppressions, severity overrides and the baseline; writes the
        baseline and the SBOM when asked. Returns the judged report or an exit status 2."""
        from ..errors import TensorscopeError
        from ..scanning.settings import apply_settings
        judged = apply_settings(report, self.settings,
                                accept=self.baseline.accept if self.baseline else None)
        from ..safetext import shown
        for line in judged.refused:   # names files: hostile text, shown escaped
            sys.stderr.write(f"tensorscope scan: warning: {shown(line)}\n")
        identities = {p: f"sha256:{inv['sha256']}" for p, inv in self.inventories.items()
                      if inv.get("sha256")}
        try:
            if self.args.write_baseline:
                from ..scanning.baseline import file_identity, write_baseline
                read = self.baseline.identity if self.baseline is not None else file_identity

                def ident(path):  # a file hashed for the SBOM or the baseline is not read again
                    return identities.get(path) or read(path)
                write_baseline(self.args.write_baseline, judged.to_dict(),
                               [*judged.findings, *(f for f, _ in judged.suppressed)], ident)
            if self.args.sbom:
                from ..scanning.sbom import inventory_of, write_sbom
                cache: dict = {}
                for path in report.files:
                    if path not in self.inventories:   # resumed from a --jsonl report
                        self.inventories[path] = _resumed_inventory(self.args.resume, path,
                                                                    cache) \
                            or _fresh_inventory(path, inventory_of)
                write_sbom(self.args.sbom, judged, self.inventories)
        except (TensorscopeError, OSError) as e:
            return error_line("scan", str(e))
        return judged

    @contextlib.contextmanager
    def output(self):
        """stdout, or the --output FILE in its place (a table then has no colours)."""
        if not self.args.output:
            yield
            return
        tmp = f"{self.args.output}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as fh, contextlib.redirect_stdout(fh):
            yield
        os.replace(tmp, self.args.output)


def _resumed_inventory(resume: str | None, path: str, cache: dict):
    if not resume:
        return None
    if "records" not in cache:
        from ..scanning.fleet import load_resume
        cache["records"] = load_resume(resume)
    return (cache["records"].get(path) or {}).get("inventory")


def _fresh_inventory(path: str, inventory_of):
    from ..formats import open_model
    try:
        model = open_model(path)
    except Exception:  # noqa: BLE001 — described as unparsed
        return inventory_of(path)
    try:
        return inventory_of(path, model)
    finally:
        model.close()
