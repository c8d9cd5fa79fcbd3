"""What judging the text a loader parses costs, as a ratio to that loader's own parse of it.

    python benchmarks/bench_scan_text.py            # prints a Markdown section (median of 7)

- chat templates: ``jinja_tree.findings`` vs transformers' renderer compiling the template
  (``ImmutableSandboxedEnvironment.from_string``, what ``apply_chat_template`` does first);
- a Hydra/NeMo-shaped YAML config: ``configs.check_text`` vs ``yaml.safe_load`` (what OmegaConf
  runs) and ``OmegaConf.create`` of the loaded dict;
- the expressions of a real ``.pt2``: ``pt2_exprs`` judging every field vs ``sympy.sympify`` of
  the expr_str values (what ``torch.export.load`` runs).
The loaders run here, in the benchmark only, as the yardstick; the scan never runs them.
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))


def _median(fn, runs: int = 7) -> float:
    fn()
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


class _Ctx:
    def __init__(self):
        self.findings = []

    def add(self, *args, **kwargs):
        self.findings.append(args)


def main() -> None:
    import json
    import zipfile

    import yaml
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    import chat_templates
    from tensorscope.scanning import configs, jinja_tree, pt2_exprs

    rows = []
    templates = list(chat_templates.ALL.values())
    ours = _median(lambda: [jinja_tree.findings(t) for t in templates])
    env = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
    theirs = _median(lambda: [env.from_string(t.replace("{% generation %}", "").replace(
        "{% endgeneration %}", "")) for t in templates])
    size = sum(map(len, templates))
    rows.append((f"{len(templates)} chat templates, {size / 1000:.1f} K chars", "judge",
                 ours, "jinja2 compile (transformers)", theirs))

    text = "".join(f"layer{i}:\n  _target_: torch.nn.Linear\n  in_features: ${{width}}\n"
                   f"  out_features: {i + 1}\n  opts: &o{i} {{bias: true, dtype: float32}}\n"
                   f"  again: *o{i}\n" for i in range(300)) + "width: 64\n"
    ours = _median(lambda: configs.check_text(_Ctx(), text, None))
    theirs = _median(lambda: yaml.safe_load(text))
    rows.append((f"Hydra-shaped YAML, {len(text) / 1000:.1f} KB", "judge", ours,
                 "yaml.safe_load", theirs))

    import torch
    with tempfile.TemporaryDirectory() as tmp:
        class M(torch.nn.Module):
            def forward(self, x, y):
                return (x[: x.shape[0] // 2] * 2).sum(0) + y.repeat(2, 1)[: x.shape[0]].sum(0)
        b = torch.export.Dim("b", min=2, max=64)
        path = os.path.join(tmp, "m.pt2")
        torch.export.save(torch.export.export(M(), (torch.randn(8, 3), torch.randn(4, 3)),
                                              dynamic_shapes={"x": {0: 2 * b}, "y": {0: b}}), path)
        with zipfile.ZipFile(path) as z:
            doc = json.loads(z.read([n for n in z.namelist() if n.endswith("model.json")][0]))
    fields = list(pt2_exprs.fields(doc))
    exprs = [t for k, t, _ in fields if k == "expr_str"]

    def judge():
        for kind, t, _ in fields:
            (pt2_exprs.judge_expr if kind == "expr_str" else pt2_exprs.judge_guard)(t)
    import sympy
    ours = _median(judge)
    theirs = _median(lambda: [sympy.sympify(e) for e in exprs])
    rows.append((f".pt2 model.json, {len(fields)} fields", "judge", ours, "sympy.sympify",
                 theirs))

    print("## Scan: text the loader parses\n")
    print("Judging each text against its loader's own parse of it (median of 7, warm; "
          "`python benchmarks/bench_scan_text.py`):\n")
    print("| input | tensorscope | loader | loader's parse | ratio |")
    print("|---|---:|---|---:|---:|")
    for name, _, a, who, b in rows:
        print(f"| {name} | {a * 1000:.1f} ms | {who} | {b * 1000:.1f} ms | {a / b:.2f}x |")


if __name__ == "__main__":
    main()
