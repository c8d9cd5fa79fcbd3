"""`tensorscope tui PATH [OTHER]`: browse a model (or diff two) in a terminal UI.

Textual is imported only when this command runs, so the other commands never pay for it.
"""
from __future__ import annotations

HELP = "browse a model in a terminal UI (tree, tensors, statistics, values; diff with two files)"
DESCRIPTION = """\
Open a model file or folder in an interactive terminal UI: a tree of modules with parameter and
byte counts (above 5,000 tensors grouped, layers.# ×N, g switches), the tensors under the
selected module (filter with /, sort with o or by clicking a header; only the rows on screen are
drawn, so 1,000,000 tensors scroll and filter like 100), and for the highlighted tensor every
metadata field, statistics (min, max, mean, std, NaN/Inf counts, zero fraction), a histogram and
a window of its values (v; . , < > move through the 2-D slices of a larger tensor). With a second
file, the UI opens on the diff: tensors aligned side by side, coloured by status, with the
difference statistics and a histogram of a - b for the highlighted pair. The static safety scan
runs at startup with the threshold of `tensorscope scan`: a red banner when a file is unsafe to
load, a yellow one when it needs review (s shows the findings, from any screen). Nothing in the
files is executed; text from them is shown inert. The files are opened before the UI starts: a
file that cannot be read is one line on stderr and exit 2, as with every command. A sharded
checkpoint is shown from its first shard on, the other shards read behind the first screen.
Keys: ? every key of the screen, ctrl+p command palette, t theme, q quit.

Example:
  tensorscope tui model.safetensors
  tensorscope tui checkpoint.pt
  tensorscope tui old.pt new.pt
"""


def add_arguments(p) -> None:
    p.add_argument("path", help="model file or folder to browse")
    p.add_argument("other", nargs="?", default=None,
                   help="second model: open the side-by-side diff of PATH and OTHER")
    p.add_argument("--no-scan", action="store_true", help="skip the startup safety scan")


def run(args) -> int:
    import tensorscope

    from ..render import opening
    from ..safetext import shown

    # The input is checked before the full-screen app starts: a missing, empty, truncated or
    # unrecognised file fails here with one line and exit 2 (the CLI's boundary), like every
    # other command, instead of an app the user has to quit.
    paths = [args.path] + ([args.other] if args.other is not None else [])
    if args.other is None:
        # One model: the app opens it in its own thread, and the CLI waits for what its first
        # screen needs (a sharded checkpoint's first shard; the rest streams in behind it, and a
        # later shard that fails to parse gets the app's error screen).
        from ..tui.app import make_app  # lazy: Textual loads only for this command

        app = make_app(args.path, scan=not args.no_scan)
        with opening(shown(args.path)):
            app.wait_opened()
        app.run()
        return 0
    models = []
    try:
        # "reading … " while a slow open runs, wiped once it is done: nothing of it is left on
        # the terminal when the app starts, nor after it quits
        with opening(" and ".join(shown(p) for p in paths)):
            for p in paths:
                models.append(tensorscope.open(p))
    except BaseException:
        for m in models:
            m.close()
        raise
    from ..tui.app import make_app  # lazy: Textual loads only for this command

    make_app(args.path, args.other, scan=not args.no_scan, models=models).run()
    return 0
