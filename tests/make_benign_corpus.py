"""Benign files written by the real libraries, in the shapes issue 23 found miscalled: a
transformers Trainer output folder, a Lightning checkpoint folder, pandas and scikit-learn pickles,
a skops archive, a TorchServe .mar (torch-model-archiver), a SageMaker-style model.tar.gz,
torch.onnx.export with model-local functions, torch.Generator / NumPy generator / pathlib state, a
zip of text files.

``build(out) -> list[Benign]``; each says the worst severity its loading deserves ("review" is
MEDIUM: loading builds library classes a weights-only load refuses) and, where it matters, a rule
that must be reported. A library that does not install skips its case (``Benign.skipped``).
Nothing here is loaded by the tests: they scan what the libraries wrote.
"""
from __future__ import annotations

import io
import os
import pickle  # used only to WRITE (dump) what the libraries pickle, never to load
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Benign:
    name: str
    path: Path
    worst: str                   # the worst severity the scan may report
    rule: str | None = None      # a rule it must report (the reason it is not clean)
    source: str = ""             # what wrote it
    skipped: str | None = None   # why it was not built


def _try(cases, name, fn, *a):
    try:
        fn(*a)
    except ImportError as e:   # a library not installed: the case is skipped, not failed
        cases.append(Benign(name, Path(), "info", skipped=str(e)))


def build(out: Path) -> list[Benign]:
    out.mkdir(parents=True, exist_ok=True)
    cases: list[Benign] = []

    def trainer():
        # the real transformers Trainer, 1 step of a tiny BERT: training_args.bin (TrainingArguments
        # and its Enum members, accelerate's state), optimizer.pt, scheduler.pt, rng_state.pth
        code = (
            "import sys, torch\n"
            "from transformers import Trainer, TrainingArguments, BertConfig, "
            "BertForSequenceClassification\n"
            "cfg = BertConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1, "
            "num_attention_heads=2, intermediate_size=8, max_position_embeddings=16)\n"
            "class DS(torch.utils.data.Dataset):\n"
            "    def __len__(self): return 4\n"
            "    def __getitem__(self, i): return {'input_ids': torch.tensor([1, 2, 3, 4]), "
            "'labels': torch.tensor(i % 2)}\n"
            "args = TrainingArguments(output_dir=sys.argv[1], max_steps=1, save_steps=1, "
            "per_device_train_batch_size=2, report_to=[], use_cpu=True, save_strategy='steps', "
            "disable_tqdm=True)\n"
            "Trainer(model=BertForSequenceClassification(cfg), args=args, train_dataset=DS()).train()\n")
        import transformers  # noqa: F401  (ImportError: skipped)
        folder = out / "trainer"
        subprocess.run([sys.executable, "-c", code, str(folder)], check=True, capture_output=True,
                       env={**os.environ, "TOKENIZERS_PARALLELISM": "false"}, timeout=600)
        cases.append(Benign("trainer", folder, "medium", "pickle.library-class",
                            "transformers.Trainer (training_args.bin, optimizer.pt, scheduler.pt, "
                            "rng_state.pth)"))
    _try(cases, "trainer", trainer)

    def lightning():
        code = (
            "import sys, torch, warnings, pathlib\n"
            "import lightning as L\n"
            "from lightning.pytorch.loggers import CSVLogger\n"
            "class M(L.LightningModule):\n"
            "    def __init__(self, lr=0.1, name='tiny'):\n"
            "        super().__init__(); self.save_hyperparameters(); self.l = torch.nn.Linear(4, 1)\n"
            "    def training_step(self, b, i):\n"
            "        x, y = b; return torch.nn.functional.mse_loss(self.l(x), y)\n"
            "    def configure_optimizers(self):\n"
            "        o = torch.optim.SGD(self.parameters(), lr=self.hparams.lr)\n"
            "        return [o], [torch.optim.lr_scheduler.StepLR(o, 1)]\n"
            "ds = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 1))\n"
            "t = L.Trainer(default_root_dir=sys.argv[1], max_steps=1, logger=CSVLogger(sys.argv[1]), "
            "enable_progress_bar=False, enable_model_summary=False, accelerator='cpu')\n"
            "t.fit(M(), torch.utils.data.DataLoader(ds, batch_size=4))\n")
        import lightning  # noqa: F401
        folder = out / "lightning"
        subprocess.run([sys.executable, "-c", code, str(folder)], check=True, capture_output=True,
                       timeout=600)
        cases.append(Benign("lightning", folder, "medium", None, "lightning.Trainer.fit (.ckpt, "
                            "hparams.yaml)"))
    _try(cases, "lightning", lightning)

    def pandas_pickles():
        import numpy as np
        import pandas as pd
        df = pd.DataFrame({"a": [1, 2], "s": ["x", "y"], "c": pd.Categorical(["u", "v"]),
                           "t": pd.to_datetime(["2024-01-01", "2024-01-02"]),
                           "f": np.array([0.5, 1.5], dtype=np.float32)})
        df.to_pickle(out / "pandas_frame.pkl")
        cases.append(Benign("pandas_frame", out / "pandas_frame.pkl", "medium",
                            "pickle.library-class", "pandas.DataFrame.to_pickle"))
        with open(out / "pandas_dtypes.pkl", "wb") as f:
            pickle.dump(df.dtypes, f)
        cases.append(Benign("pandas_dtypes", out / "pandas_dtypes.pkl", "medium", None,
                            "pickle.dump(DataFrame.dtypes)"))
    _try(cases, "pandas", pandas_pickles)

    def sklearn_models():
        import joblib
        import numpy as np
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import Pipeline
        from sklearn.preprocessing import StandardScaler
        X = np.random.default_rng(0).random((20, 3))
        y = (X[:, 0] > 0.5).astype(int)
        p = Pipeline([("s", StandardScaler()), ("lr", LogisticRegression())]).fit(X, y)
        with open(out / "sklearn_pipeline.pkl", "wb") as f:
            pickle.dump(p, f)
        joblib.dump(p, out / "sklearn_pipeline.joblib")
        for n in ("sklearn_pipeline.pkl", "sklearn_pipeline.joblib"):
            cases.append(Benign(n, out / n, "medium", "pickle.library-class", "scikit-learn + "
                                "pickle/joblib"))
        import skops.io as sio
        sio.dump(p, out / "sklearn_pipeline.skops")
        cases.append(Benign("sklearn_pipeline.skops", out / "sklearn_pipeline.skops", "info", None,
                            "skops.io.dump"))
    _try(cases, "sklearn", sklearn_models)

    import torch

    def torchserve():
        folder = out / "torchserve_src"
        folder.mkdir(exist_ok=True)
        torch.save(torch.nn.Linear(4, 2).state_dict(), folder / "model.pt")
        (folder / "requirements.txt").write_text("certifi==2024.2.2\ncharset-normalizer\n")
        (folder / "index_to_name.json").write_text('{"0": "cat", "1": "dog"}')
        exe = Path(sys.executable).with_name("torch-model-archiver")
        cmd = [str(exe) if exe.exists() else "torch-model-archiver"]
        try:
            subprocess.run(cmd + ["--model-name", "linear", "--version", "1.0", "--serialized-file",
                                  str(folder / "model.pt"), "--handler", "image_classifier",
                                  "--extra-files", str(folder / "index_to_name.json"),
                                  "--requirements-file", str(folder / "requirements.txt"),
                                  "--export-path", str(out), "-f"], check=True,
                           capture_output=True, timeout=300)
        except FileNotFoundError as e:
            raise ImportError(f"torch-model-archiver: {e}") from e
        cases.append(Benign("torchserve.mar", out / "linear.mar", "medium",
                            "archive.torchserve-handler", "torch-model-archiver, built-in handler"))
    _try(cases, "torchserve", torchserve)

    # SageMaker's PyTorch layout: model.tar.gz = model.pth + code/inference.py + requirements.txt
    buf = io.BytesIO()
    torch.save(torch.nn.Linear(4, 2).state_dict(), buf)
    members = {"model.pth": buf.getvalue(),
               "code/inference.py": b"import torch\n\ndef model_fn(model_dir):\n"
                                    b"    return torch.load(model_dir + '/model.pth', weights_only=True)\n",
               "code/requirements.txt": b"certifi==2024.2.2\ncharset-normalizer\n"}
    with tarfile.open(out / "sagemaker_model.tar.gz", "w:gz") as t:
        for n, data in members.items():
            info = tarfile.TarInfo(n)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    cases.append(Benign("sagemaker_model.tar.gz", out / "sagemaker_model.tar.gz", "medium",
                        "archive.python-source", "tarfile in SageMaker's model.tar.gz layout"))

    # torch.onnx.export with model-local functions
    class Blk(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return torch.relu(self.lin(x))

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = Blk(), Blk()

        def forward(self, x):
            return self.b(self.a(x))

    try:
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(Net(), (torch.zeros(1, 4),), str(out / "onnx_functions.onnx"),
                              dynamo=False, export_modules_as_functions={Blk})
        cases.append(Benign("onnx_functions.onnx", out / "onnx_functions.onnx", "info",
                            "onnx.local-functions", "torch.onnx.export(export_modules_as_functions)"))
    except Exception as e:  # noqa: BLE001 — an exporter that cannot run here skips the case
        cases.append(Benign("onnx_functions.onnx", Path(), "info", skipped=repr(e)))

    # known-inert state: torch.Generator, NumPy generators, pathlib paths (torch.save and pickle)
    import numpy as np
    state = {"gen": torch.Generator().manual_seed(1), "np_rng": np.random.default_rng(0),
             "np_legacy": np.random.RandomState(0), "path": Path("/data/train"),
             "pure": __import__("pathlib").PurePosixPath("a/b")}
    torch.save(state, out / "inert_state.pt")
    cases.append(Benign("inert_state.pt", out / "inert_state.pt", "low", None,
                        "torch.save of torch.Generator, NumPy generators, pathlib paths"))
    with open(out / "inert_state.pkl", "wb") as f:
        pickle.dump({k: v for k, v in state.items() if k != "gen"}, f)
    cases.append(Benign("inert_state.pkl", out / "inert_state.pkl", "low", None,
                        "pickle.dump of NumPy generators and pathlib paths"))

    # a zip of text files is not a model
    with zipfile.ZipFile(out / "texts.zip", "w") as z:
        z.writestr("README.md", "# notes\n")
        z.writestr("config/params.yaml", "lr: 0.1\n")
        z.writestr("requirements.txt", "certifi\n")
    cases.append(Benign("texts.zip", out / "texts.zip", "info", "file.not-a-model", "zipfile"))
    return cases
