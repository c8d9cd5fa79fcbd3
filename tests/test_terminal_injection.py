"""Text from a file never drives the terminal, whichever command shows it (issue 14, class 6).

One sweep over every command's human output (tables, summaries, grouped views, findings, diff
rows, convert reports, errors) with names, metadata keys and values, globals and member names
full of escape sequences, bidi overrides and Rich markup. Each command has its own finer tests;
this one guards the seams between them.
"""
from __future__ import annotations

import io
import zipfile

import pytest

from tensorscope.cli import main
from tensorscope.safetext import is_clean

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

# OSC window title, CSI clear screen and colour, a bidi override, a C1 control, Rich markup.
EVIL = "x\x1b]0;pwned\x07\x1b[2J\x1b[31my\u202ez\x85[bold red]loud[/]"
EVIL_FILE = EVIL.replace("/", "")   # a file name cannot hold the separator


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    sd = {f"{EVIL}.weight": torch.ones(3), "model.layers.0.w": torch.zeros(2),
          "model.layers.1.w": torch.zeros(2)}
    torch.save(sd, d / "a.pt")
    sd2 = {k: v + 1 for k, v in sd.items()}
    sd2[f"only_in_b{EVIL}"] = torch.ones(1)
    torch.save(sd2, d / "b.pt")
    safetensors_torch.save_file({k: v.contiguous() for k, v in sd.items()}, str(d / "m.safetensors"),
                                metadata={EVIL: EVIL})
    # a torch zip with a hostile extra member name and a global named by the file
    buf = io.BytesIO()
    torch.save(sd, buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as src, \
            zipfile.ZipFile(d / "c.pt", "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info))
        dst.writestr(f"a/extra/{EVIL}", b"payload")
    proto2 = (b"\x80\x02c" + f"os{EVIL}\nsystem{EVIL}\n".encode("utf-8")
              + b"X\x02\x00\x00\x00id\x85R.")
    (d / "g.pkl").write_bytes(proto2)
    (d / f"bad{EVIL_FILE}.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    return d


COMMANDS = [
    ["inspect", "{d}/a.pt"],
    ["inspect", "--no-group", "--stats", "{d}/a.pt"],
    ["inspect", "--group", "{d}/a.pt"],
    ["inspect", "{d}/m.safetensors"],
    ["inspect", "{d}/c.pt"],
    ["inspect", "{d}/g.pkl"],
    ["scan", "--min-severity", "info", "{d}/a.pt", "{d}/c.pt", "{d}/g.pkl", "{d}/m.safetensors"],
    ["diff", "{d}/a.pt", "{d}/b.pt"],
    ["diff", "-v", "{d}/a.pt", "{d}/m.safetensors"],
    ["diff", "--by", "layer", "{d}/a.pt", "{d}/b.pt"],
    ["diff", "--by", "module", "{d}/a.pt", "{d}/b.pt"],
    ["convert", "--force", "{d}/a.pt", "{d}/out.safetensors"],
    ["inspect", "{d}/bad" + EVIL_FILE + ".safetensors"],
    ["scan", "{d}/missing" + EVIL_FILE],
    ["diff", "{d}/a.pt", "{d}/bad" + EVIL_FILE + ".safetensors"],
]


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(x.replace("{d}/", "") for x in a)[:40])
def test_no_raw_control_character_reaches_the_terminal(hostile, argv, capsys):
    code = main([a.format(d=hostile) for a in argv])
    out, err = capsys.readouterr()
    failing = any("bad" in a or "missing" in a for a in argv)
    assert code == 2 if failing else code in (0, 1), (code, err)
    assert out or err
    assert is_clean(out), out
    assert is_clean(err), err
    # markup from the file is printed literally, never interpreted (and so never eaten)
    if "x\\x1b" in out + err:
        assert "[bold red]loud[" in out + err
