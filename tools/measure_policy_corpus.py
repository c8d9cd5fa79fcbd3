"""Count what scan makes of issue 23's corpus: attacks caught at MEDIUM or above, benign files
written by real libraries reported above MEDIUM (UNSAFE) or above what their loading deserves.

Usage: python tools/measure_policy_corpus.py OUT_DIR   (builds both corpora into OUT_DIR; run it
with another checkout's tensorscope on PYTHONPATH to compare, the corpora stay the same)
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import make_attack_corpus  # noqa: E402
import make_benign_corpus  # noqa: E402

from tensorscope.scanning import scan_paths  # noqa: E402
from tensorscope.scanning.report import Severity  # noqa: E402


def main(out: Path) -> None:
    attacks = []

    def add(name, data, rule, severity="critical", trigger=None, source=""):
        p = out / "attacks" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        attacks.append(p)
    make_attack_corpus.issue23_sections(add)
    benign = [c for c in make_benign_corpus.build(out / "benign") if not c.skipped]
    caught = sum(1 for p in attacks if (r := scan_paths(p)).findings and r.severity >= Severity.MEDIUM)
    unsafe = due = 0
    for c in benign:
        r = scan_paths(c.path)
        worst = r.severity if r.findings else Severity.INFO
        unsafe += worst > Severity.MEDIUM
        due += worst > Severity.parse(c.worst)
    print(f"attacks caught (>= medium): {caught}/{len(attacks)}; benign UNSAFE (> medium): "
          f"{unsafe}/{len(benign)}; benign above their due: {due}/{len(benign)}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
