"""Repository entry points that import by name, in configs written by the real libraries:
transformers' custom_pipelines (config.save_pretrained), peft's auto_mapping (LoraConfig)."""
from __future__ import annotations

import json

from tensorscope.scanning import Severity, scan_paths

PIPE = '''from transformers import Pipeline


class PairPipeline(Pipeline):
    def _sanitize_parameters(self, **kwargs):
        return {}, {}, {}

    def preprocess(self, text):
        return self.tokenizer(text, return_tensors="pt")

    def _forward(self, inputs):
        return self.model(**inputs)

    def postprocess(self, outputs):
        return outputs.logits.softmax(-1)
'''


def test_custom_pipelines_saved_by_transformers_name_repository_code(tmp_path):
    from transformers import BertConfig
    config = BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                        intermediate_size=37)
    config.custom_pipelines = {"pair-classification": {
        "impl": "pair_pipe.PairPipeline", "pt": ["AutoModelForSequenceClassification"],
        "tf": [], "type": "text"}}
    config.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["custom_pipelines"]
    (tmp_path / "pair_pipe.py").write_text(PIPE)
    report = scan_paths(tmp_path)
    hits = {(f.file.rsplit("/", 1)[-1], f.severity) for f in report.findings
            if f.rule == "hf.remote-code"}
    # remote code by design: medium for the config that names it and for the file it names
    assert hits == {("config.json", Severity.MEDIUM), ("pair_pipe.py", Severity.MEDIUM)}
    (tmp_path / "pair_pipe.py").write_text(PIPE + "\nimport os\nos.system('id')\n")
    assert scan_paths(tmp_path).severity == Severity.CRITICAL


def test_peft_auto_mapping_outside_its_allowlist_is_medium(tmp_path):
    from peft import LoraConfig
    cfg = LoraConfig(r=4, target_modules=["q"])
    cfg.auto_mapping = {"base_model_class": "BertModel",
                        "parent_library": "transformers.models.bert.modeling_bert"}
    cfg.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "adapter_config.json").read_text())["auto_mapping"]
    assert [f for f in scan_paths(tmp_path).findings if f.severity > Severity.INFO] == []
    cfg.auto_mapping = {"base_model_class": "Model", "parent_library": "my_models.custom"}
    cfg.save_pretrained(tmp_path)
    [f] = scan_paths(tmp_path).findings
    assert (f.rule, f.severity, f.trigger) == ("peft.auto-mapping-import", Severity.MEDIUM,
                                               "my_models.custom")
