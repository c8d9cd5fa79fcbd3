"""The rule registry: every finding the scanner can report, declared once.

Each `Rule` has a stable id, a default severity, a one-line title, a rationale (why that severity)
and references (the public advisory or loader source it follows). A rule whose severity depends on
context declares each case as a named variant here; judge functions name the rule (and variant),
never a severity. Every anomaly kind a parser can emit (``model.evidence.anomalies``) is declared in
`ANOMALIES` (kind -> rule); ``tests/test_scan_rules.py`` fails on an undeclared one.

``tensorscope scan --list-rules`` prints this table; SARIF output carries it as
``tool.driver.rules`` (``fullDescription``, ``help``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum


class Severity(IntEnum):
    """How bad loading the file would be (`SEVERITY_MEANING`); lives with the registry that
    assigns it, so the report imports the registry and never the reverse."""

    INFO = 0
    LOW = 1
    MEDIUM = 2
    HIGH = 3
    CRITICAL = 4

    def __str__(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> "Severity":
        try:
            return cls[str(text).upper()]
        except KeyError:
            raise ValueError(f"unknown severity {text!r} (one of: "
                             f"{', '.join(str(s) for s in cls)})") from None


__all__ = ["Severity", "Rule", "RULES", "ANOMALIES", "SEVERITY_MEANING", "severity_of", "anomaly_rule"]

C, H, M, L, I = Severity.CRITICAL, Severity.HIGH, Severity.MEDIUM, Severity.LOW, Severity.INFO

_PICKLESCAN = "https://github.com/mmaitre314/picklescan/security/advisories"
_WEIGHTS_ONLY = "https://github.com/pytorch/pytorch/blob/main/torch/_weights_only_unpickler.py"
_PICKLE = "https://docs.python.org/3/library/pickle.html"
_FICKLING = "https://github.com/trailofbits/fickling"


# What each severity means: what loading the file would do. One table, shown by --list-rules.
SEVERITY_MEANING: dict[Severity, str] = {
    C: "loading runs code the file chose (a code-running global imported, a second stage, a "
       "template or config that reaches the interpreter)",
    H: "loading runs code outside the framework that is not known inert, or the file could not "
       "be read completely (never called clean)",
    M: "loading builds classes a weights-only load refuses, or imports library/user code "
       "(review; the message says the safe way to load)",
    L: "evidence: a detail worth knowing that runs nothing",
    I: "evidence: known-inert content, layout notes",
}


@dataclass(frozen=True)
class Rule:
    id: str
    severity: Severity
    title: str
    rationale: str
    references: tuple[str, ...] = ()
    variants: dict[str, Severity] = field(default_factory=dict)  # context -> severity


RULES: dict[str, Rule] = {}


def _rule(id: str, severity: Severity, title: str, rationale: str, *references: str,
          **variants: Severity) -> None:
    assert id not in RULES, id
    RULES[id] = Rule(id, severity, title, rationale, tuple(references), variants)


# --- pickles ---------------------------------------------------------------------------------------
_rule("pickle.dangerous-global", C, "The pickle imports a callable that can run code",
      "A denylisted callable or module (os.system, eval, subprocess, pickle.loads, getattr ...): "
      "loading imports it and usually calls it, so loading runs the attacker's code.",
      _PICKLE, _PICKLESCAN)
_rule("pickle.dynamic-global", C, "A STACK_GLOBAL imports a name computed while loading",
      "What it imports (a call's result, a global such as os.name) cannot be known without running "
      "the pickle, so it is judged as the worst it could be.", _FICKLING)
_rule("pickle.global-mutation", C, "The pickle writes into an object it imported",
      "BUILD, SETITEM or APPEND aimed at a global (a class, a function, a module-level dict) "
      "rather than at an object the pickle built: it rewires copyreg's extension registry so EXT "
      "opcodes import names no GLOBAL shows, or sets attributes that a later STACK_GLOBAL reads "
      "back (modelscan issue #85). Standard picklers never emit it.",
      _PICKLE, "https://github.com/protectai/modelscan/issues/85")
_rule("pickle.reader-disagreement", C, "CPython's own readers read these bytes differently",
      "An opcode across a FRAME end: pickle.loads reads on, torch.load's io.BytesIO reads from after "
      "the frame. Opcodes can hide from any one reading, and no writer produces this.", _PICKLE)
_rule("pickle.second-stage", C, "The pickle hands bytes to a deserializer",
      "pickle.loads, torch.load, numpy.load, marshal.loads... called at load time run a second "
      "payload; it is scanned recursively, and the hand-over alone is code execution.", _PICKLESCAN)
_rule("pickle.torch-storage-bytes", L, "torch's own pickling of a tensor (pickle.dumps(tensor))",
      "Storage.__reduce__ writes torch.storage._load_from_bytes(bytes): a nested torch.load of a "
      "checkpoint that was scanned completely and found clean. LOW: it still needs "
      "weights_only=False.")
_rule("pickle.unknown-call-string", H, "A call of a global outside the allowlist with a string",
      "Strings from the file handed to an unknown callable (called by the pickle, or by an "
      "allowlisted caller it is handed to: _rebuild_from_type_v2 runs func(*args)) are how "
      "commands and paths reach code; loading runs code outside the framework that is not known "
      "inert, but not proven dangerous, so HIGH rather than CRITICAL. Enum members and value "
      "classes of known libraries are pickle.library-class instead.")
_rule("pickle.indirect-call", H, "The pickle calls the result of another call",
      "getattr chains and methodcaller gadgets call something no name in the file names.",
      _PICKLESCAN)
_rule("pickle.parse-error", H, "The pickle is broken",
      "Loaders run every opcode before the break, so what precedes it counts, and what follows it "
      "was not read: never reported clean.")
_rule("pickle.user-class", M, "Loading instantiates or imports user code",
      "A class or module of user code, outside the known libraries and the allowlist "
      "(whole-module torch.save(model), a training script's classes): importing its module runs "
      "that module's top-level code, and torch.load(weights_only=True) refuses it. Library "
      "classes (sklearn estimators, transformers enums) are pickle.library-class.")
_rule("pickle.unknown-call", M, "The pickle calls a global outside the allowlist",
      "Not known to be dangerous and not known to be safe: review before loading.", _WEIGHTS_ONLY)
_rule("pickle.multiple-streams", M, "Another pickle follows STOP",
      "pickle.load reads only the first stream; torch's legacy reader and other consumers read on. "
      "Each stream found after STOP, wherever it starts, is also judged on its own.", _FICKLING)
_rule("pickle.unknown-import", M, "The pickle imports a library global that is not known inert",
      "Judged on its own, as torch's weights-only allowlist judges it: neither code-running nor "
      "known inert, so at least MEDIUM whether or not a call on it is seen (a global can be "
      "reached later through BUILD, a caller that calls its arguments, or __reduce__ chains). "
      "User modules are reported as pickle.user-class.", _WEIGHTS_ONLY)
_rule("pickle.library-class", M, "Loading builds a class of a known library (review)",
      "An Enum member, dtype or value class of transformers, accelerate, pandas, scikit-learn, "
      "NumPy, Lightning or the standard library (TrainingArguments' IntervalStrategy('steps'), "
      "pandas.StringDtype): that library's constructor and __setstate__ run, nothing the file "
      "wrote, but torch.load(weights_only=True) refuses it. MEDIUM at most; the message names the "
      "class family and the safe way to load.", _WEIGHTS_ONLY)
_rule("pickle.resource-bomb", H, "An allowlisted builtin is asked for a huge amount of work or memory",
      "sum(range(10**18)), bytes(10**12), bytearray, a huge repetition: every callable is on the "
      "allowlist, and loading still never finishes or exhausts memory (denial of service). "
      "Reported with the size or work it would cause, like reference bombs.", _PICKLE)
_rule("pickle.trailing-data", L, "Bytes follow the pickle's STOP that are not a pickle",
      "pickle.load ignores them and no pickle stream was found anywhere in them; kept as a note "
      "because a consumer may read them.")
_rule("pickle.framework-class", I, "The pickle names a known-inert framework class",
      "torch nn modules, TorchScript classes, DCP metadata, torch.Generator and NumPy random "
      "state, pathlib paths: constructing them and their __setstate__ run nothing the file "
      "chose. INFO; the message says that torch.load(weights_only=True) still refuses them and "
      "how to load safely.", _WEIGHTS_ONLY)
_rule("pickle.object-array", I, "A NumPy object array",
      "np.load needs allow_pickle=True and unpickles its data; that pickle is scanned.")
_rule("pickle.reference-bomb", H, "Shared references expand to a huge object (billion laughs)",
      "Memo GETs and DUPs let a small pickle build a tree that shares its branches; loading is cheap "
      "but copying, printing or re-serialising materialises every element (2^60 from a few hundred "
      "bytes), exhausting memory of whatever handles the object. Reported with the size it would "
      "materialise to.", "https://en.wikipedia.org/wiki/Billion_laughs_attack")
_rule("pickle.loader-rejects", M, "The real loader raises on this pickle",
      "CPython fails where the inert VM kept going (a dict keyed by an unhashable list): the file "
      "is broken or crafted for readers that do not fail, and is never reported clean.", _PICKLE)
_rule("pickle.findings-capped", I, "More findings of a rule in one pickle than are listed",
      "A hostile pickle can name a global a million times; each rule's first findings are listed "
      "and the rest counted in one line. The listed ones carry the severity.",
      **{str(s): s for s in Severity})

# --- data that carries a pickle ---------------------------------------------------------------------
_rule("data.embedded-pickle", L, "A complete pickle stored as data",
      "A bytes value, base64 or hex text, an extra_state blob or a safetensors __metadata__ value "
      "holds a pickle. Loading the file does not run it, but one pickle.loads(obj[key]) in the "
      "consumer does: it is scanned recursively and its findings are reported at the severity of "
      "what it would do (LOW here: the carrier itself).", _FICKLING)

# --- files -----------------------------------------------------------------------------------------
_rule("file.unparseable", H, "The file could not be parsed completely",
      "What could not be read cannot be called safe: a parser failure, a content no reader "
      "recognises, nesting past the scan limit.")
_rule("file.loader-rejects", M, "The format's real loader rejects this file",
      "tensorscope.open fails where a loader also fails (a .npy cut short, a corrupt .pkl member): "
      "a truncated or crafted file is never reported clean, whatever the byte-level view saw.")
_rule("file.unsupported-archive", H, "An archive the standard library cannot open",
      "7z, rar and zstd content (possibly a pickle, as in the nullifAI models) is not scanned.",
      "https://www.reversinglabs.com/blog/rl-identifies-malware-ml-model-hosted-on-hugging-face")
_rule("file.decompression-limit", H, "A compressed stream exceeds the decompression cap",
      "The rest is not scanned (a decompression bomb or a huge payload).")
_rule("file.extension-mismatch", M, "The content does not match the extension",
      "Pickle-bearing content (a zip, a compressed pickle) behind an unrelated name hides from tools "
      "that dispatch on names. HIGH when the name promises a format without code (a pickle named "
      ".safetensors); LOW when both name and content carry pickles.",
      misleads=H, differs=L)
_rule("file.polyglot", H, "Different readers see different content",
      "A zip hidden behind another head: Python's zipfile and other scanners see it, the loader does "
      "not (or the other way round).", _PICKLESCAN)
_rule("file.not-a-model", I, "A text file that is not a pickle",
      "No loader runs code from it.")
_rule("file.symlink-outside", L, "A symlink leaving the scanned tree",
      "It was not followed; a link inside a tar is MEDIUM (extracting it writes outside the folder).",
      link_in_tar=M)
_rule("archive.torchserve-handler", M, "A TorchServe .mar names the handler that serves it",
      "MAR-INF/MANIFEST.json's handler is what TorchServe imports to load and run the model: a "
      "built-in handler (image_classifier, text_classifier ...) is TorchServe's own code (LOW: "
      "a known layout); any other handler is code of the archive (judged as "
      "archive.python-source) or of the server's environment (MEDIUM).",
      "https://github.com/pytorch/serve/blob/master/model-archiver/README.md", builtin=L)
_rule("skops.untrusted-type", M, "A skops archive builds a type skops does not trust by default",
      "skops.io.load refuses types outside its trusted set unless the caller passes them in "
      "trusted=[...] (skops.io.get_untrusted_types lists them): review before trusting. "
      "CRITICAL when the type is code-running.",
      "https://skops.readthedocs.io/en/stable/persistence.html", denied=C)
_rule("file.empty", M, "An empty file",
      "Nothing to load: torch.load and pickle.load raise on it. Not code, but not a model either.")
_rule("file.unreadable", H, "The file or folder could not be opened",
      "Not read, so not known to be safe.")

# --- zip archives (reader checks; the rest are parser anomalies below) -------------------------------
_rule("zip.member-unreadable", H, "An archive member cannot be read",
      "Its content is not scanned (a bad CRC makes picklescan skip the member: CVE-2025-10156).",
      "https://nvd.nist.gov/vuln/detail/CVE-2025-10156")
_rule("zip.torch-refuses", M, "PyTorch's zip reader (miniz) would refuse this archive",
      "While other readers open it: they disagree on what the file holds.")

# --- TorchScript code ---------------------------------------------------------------------------------
_rule("torchscript.foreign-call", H, "TorchScript code calls outside torch, ops and the builtins",
      "torch.jit.load compiles and runs code/ files; a call outside the TorchScript vocabulary is "
      "user code. CRITICAL for os/sys/subprocess/eval/open/load_library and for the builtins "
      "that reach the file system from compiled code (torch.save / aten::save writes any path, "
      "torch.from_file maps any file).", dangerous=C)
_rule("torchscript.custom-op", M, "TorchScript code calls a custom operator namespace",
      "Loading needs a native library for it.")
_rule("torchscript.code-unparseable", H, "A TorchScript code/ file does not tokenize",
      "Not read, so not known to be safe.")

_rule("archive.python-source", M, "An archive carries Python source that its loader imports",
      "TorchServe imports a .mar's handler module to serve the model, torch.package's "
      "PackageImporter imports the packaged modules a pickle names: their code runs as loaded, "
      "by design. CRITICAL when a source runs commands, evaluates or loads code, opens sockets or "
      "calls native code (os.system, subprocess, eval, exec, __import__, ctypes, socket, "
      "pickle.loads, shutil.rmtree ...); paths, files and torch.load are a handler's job. The "
      "source is tokenized, never compiled.",
      "https://pytorch.org/docs/stable/package.html",
      "https://github.com/pytorch/serve/blob/master/model-archiver/README.md",
      dangerous=C)

_rule("tar.absolute-or-parent-path", H, "A tar member path escapes the extraction folder",
      "NeMo restores a .nemo by extracting its tar, as do other tools that ship models as tars; "
      "a member named '/...' or with a '..' component is written outside the folder by "
      "tarfile.extractall without the 'data' filter (CVE-2007-4559, CWE-22): any file of the "
      "user can be overwritten (~/.bashrc, a site-packages module).",
      "https://nvd.nist.gov/vuln/detail/CVE-2007-4559")

# --- Hugging Face repositories ----------------------------------------------------------------------
_rule("hf.remote-code", M, "A model repository ships Python code that its loader imports",
      "An auto_map in config.json, tokenizer_config.json or a processor config names module.Class; "
      "from_pretrained(trust_remote_code=True) fetches module.py and what it imports relatively, "
      "and imports them (custom_generate/generate.py and diffusers' custom components in "
      "model_index.json likewise). Their top level runs at load, by design: medium for the config "
      "that names the code and for each file it names. HIGH when the code lives in another "
      "repository, which this scan did not read. CRITICAL when a named file runs commands, "
      "evaluates or loads code, opens sockets or calls native code (os.system, subprocess, eval, "
      "exec, __import__, ctypes, socket, pickle.loads, shutil.rmtree ...); HIGH when a named "
      "file does not tokenize or is larger than 1 MiB (not read, so not known to be safe). "
      "Sources are tokenized, never compiled.",
      "https://huggingface.co/docs/transformers/custom_models",
      "https://huggingface.co/docs/transformers/main/en/generation_strategies#custom-generation-methods",
      dangerous=C, unread=H, **{"other-repo": H})
_rule("peft.auto-mapping-import", M, "A peft adapter config names a library to import",
      "AutoPeftModel.from_pretrained imports adapter_config.json's auto_mapping parent_library "
      "with importlib.import_module when task_type is unset (peft/auto.py); peft refuses a "
      "library outside diffusers, lerobot, megatron-core and transformers unless the caller's "
      "import_allowlist names it, older versions imported any: an installed module's top level "
      "runs.", "https://github.com/huggingface/peft/blob/main/src/peft/auto.py")
_rule("mlflow.loader-module", M, "An MLflow model loads through a Python module of its own",
      "An MLmodel's python_function flavor names a loader_module outside mlflow.*; "
      "mlflow.pyfunc.load_model puts the model's code/ folder on sys.path, imports the module and "
      "calls its _load_pyfunc: its code runs at load, by design. Medium for the MLmodel and for "
      "the module file; CRITICAL when the file runs commands, evaluates or loads code, opens "
      "sockets or calls native code; HIGH when it does not tokenize or is over 1 MiB. A "
      "python_model.pkl is a cloudpickle, judged as a pickle.",
      "https://mlflow.org/docs/latest/ml/model/", dangerous=C, unread=H)
_rule("hf.chat-template-code", H, "A repository's chat template reaches for the interpreter",
      "tokenizer_config.json's chat_template, chat_template.jinja/.json and "
      "additional_chat_templates/ are Jinja that apply_chat_template renders for every chat, in "
      "an immutable sandbox that refuses '_'-names. The template is parsed by jinja2 and its tree "
      "walked with constant folding (~, +, format, join, replace, first/last, escapes, set "
      "variables, macro arguments): HIGH when it reaches a private, dunder or sandbox-internal "
      "attribute by any spelling (getattr, subscript, attr(), map(attribute=), str.format "
      "fields), an attempt to escape the sandbox (and an unsandboxed renderer, CVE-2024-34359); "
      "MEDIUM when it computes attribute names from '_' or reads an interpreter object's printed "
      "form, or does not parse (rendering fails; not judged); LOW when it only names lipsum, "
      "cycler, joiner or self. Real templates do none of it.",
      "https://github.com/abetlen/llama-cpp-python/security/advisories/GHSA-56xg-wfcc-g829",
      suspect=M, unparsed=M, evidence=L)

# --- configs that loaders turn into calls -----------------------------------------------------------
_rule("config.hydra-target", C, "A config's Hydra _target_ names a callable that runs code",
      "NeMo (.nemo model_config.yaml), Lightning and Hydra-based trainers restore a model with "
      "hydra.utils.instantiate, which imports and calls the dotted name of every _target_ key "
      "(CVE-2025-23304; _partial_ binds it for the caller to call), and of every "
      "${get_method:...} interpolation: os.system, eval, subprocess ... run when the model "
      "loads. Configs are decoded by their loaders' parsers (PyYAML's composer: anchors, "
      "aliases, merge keys, escapes; json.loads) and OmegaConf interpolations resolved over the "
      "document. Targets the pickle policy does not deny (the model's own classes) are not "
      "reported, nor functools.partial and torch.compile (what they wrap is judged on its own). "
      "MEDIUM when a _target_ does not resolve from the document alone (oc.env, custom "
      "resolvers): whatever it resolves to is called.",
      "https://nvd.nist.gov/vuln/detail/CVE-2025-23304", unresolved=M)
_rule("config.yaml-python-tag", H, "A YAML config carries a python object tag",
      "python/object/apply, /new, /object, /name and /module tags (as PyYAML resolves them: !!, "
      "%TAG directives, verbatim !<tag:yaml.org,2002:python/...>) build objects under PyYAML's "
      "unsafe loader (CVE-2021-4118). CRITICAL when the named callable is denied; HIGH for one "
      "not known inert; LOW for known-inert classes (Lightning's hparams.yaml writes "
      "!!python/object/apply:pathlib.PosixPath; its full_load refuses the tag) and builtin value "
      "tags (python/tuple ...).",
      "https://nvd.nist.gov/vuln/detail/CVE-2021-4118", denied=C, inert=L)

_rule("config.jsonpickle", M, "A JSON document is a jsonpickle encoding of objects",
      "jsonpickle.decode imports every py/object, py/type and py/function it names and calls "
      "them (py/reduce, py/newargs), as an unpickler does; py/repr is evaluated with eval. Keys "
      "are read from the decoded JSON (\\u and \\/ escapes resolved as json.loads resolves "
      "them). CRITICAL when the named callable is denied, and for any py/repr.",
      "https://jsonpickle.github.io/", denied=C)
_rule("pt2.evaluated-text", C, "A .pt2 archive holds text that loading it evaluates as code",
      "torch.export.load passes every expr_str of models/*.json to sympy.sympify, which evals it "
      "over sympy's namespace and Python's builtins; ExportedProgram.module() pastes every "
      "guards_code entry into a guard function it execs and runs on every call (torch 2.13 "
      "torch/_export/serde/serialize.py, torch/export/_unlift.py). Each is tokenized (never "
      "compiled) and accepted only when made of what torch writes (srepr shape expressions; "
      "size/stride guards); anything else runs code the file chose. HIGH when it is longer than "
      "64 K characters (not judged).",
      "https://github.com/pytorch/pytorch/blob/main/torch/_export/serde/serialize.py",
      unjudged=H)

# --- ONNX ---------------------------------------------------------------------------------------------
_rule("onnx.external-data-escape", H, "ONNX external data points outside the model's folder",
      "An absolute path, '..' or a symlink lets a model read any file when loaded.",
      "https://github.com/onnx/onnx/security/advisories/GHSA-cx5q-jgpv-4w84")
_rule("onnx.custom-domain", M, "ONNX nodes use operators from a non-standard domain",
      "Runtimes load native custom-op libraries to run them. Only domains that a node uses count: "
      "an opset import nobody uses loads nothing.")

_rule("onnx.local-functions", I, "ONNX nodes call functions the model defines",
      "FunctionProtos in the model (torch.onnx.export(export_modules_as_functions=...)) are "
      "expanded by the runtime from the model itself: no custom-op library is loaded.",
      "https://onnx.ai/onnx/repo-docs/IR.html#functions")
_rule("zip.hidden-local-entry", H, "A zip entry only streaming readers see carries findings",
      "Local file headers before the first listed member are skipped by zipfile and miniz but read "
      "first by streaming unzippers; their content is scanned and this says where it hides.",
      "https://github.com/mmaitre314/picklescan/security/advisories/GHSA-7q5r-7gvp-wc82")

# --- GGUF ----------------------------------------------------------------------------------------------
_rule("gguf.chat-template-code", C, "A GGUF chat template reaches the interpreter",
      "tokenizer.chat_template is Jinja2 that llama.cpp front ends render for every chat "
      "(llama-cpp-python < 0.2.72 unsandboxed, CVE-2024-34359). The template is parsed by jinja2 "
      "and its tree walked with constant folding: CRITICAL when it reaches a private, dunder or "
      "sandbox-internal attribute by any spelling; HIGH when it computes attribute names from "
      "'_' or reads an interpreter object's printed form (how '_' is spelled without writing "
      "it); MEDIUM when it does not parse (rendering fails; not judged); LOW when it only names "
      "lipsum, cycler, joiner or self. Real templates do none of it.",
      "https://github.com/abetlen/llama-cpp-python/security/advisories/GHSA-56xg-wfcc-g829",
      suspect=H, unparsed=M, evidence=L)

_rule("safetensors.metadata-code", L, "safetensors metadata holds Python source",
      "A __metadata__ value parses as Python that calls eval, os.system, subprocess and the like "
      "(the repository-code rules; tokenized, never compiled). safetensors never "
      "interprets metadata, transformers reads only 'format', diffusers, sd-scripts and ComfyUI "
      "read values as JSON or text: no known loader evaluates it, so this is evidence, not a "
      "load-time risk.", "https://github.com/huggingface/safetensors")

# --- Keras ------------------------------------------------------------------------------------------
_KERAS_1550 = "https://github.com/keras-team/keras/security/advisories/GHSA-48g7-3x6r-xfhp"
_rule("keras.lambda-bytecode", C, "A Keras Lambda layer holds marshalled Python bytecode",
      "keras.saving.load_model unmarshals a Lambda layer's base64 bytecode and calls it: arbitrary "
      "code at load (CVE-2024-3660). Keras 3 refuses it in safe_mode for .keras archives only; "
      "for .h5 files safe_mode is ignored (CVE-2025-9905), and safe_mode=False runs it anywhere.",
      "https://nvd.nist.gov/vuln/detail/CVE-2024-3660",
      "https://github.com/io-no/CVE-Reports/issues/7")
_rule("keras.lambda-source", L, "A Keras Lambda layer holds Python source text",
      "A Lambda's function given as source text (lambda x: eval(...)) rather than base64 "
      "bytecode. Keras' func_load base64-decodes and unmarshals it, which fails on text, so "
      "loading with Keras does not run it; the text is judged with the repository-code rules "
      "(tokenized, never compiled): HIGH when it evaluates code, runs commands, imports os or "
      "subprocess and the like (written to run, by any tool that compiles it), LOW otherwise.",
      "https://nvd.nist.gov/vuln/detail/CVE-2024-3660", dangerous=H)
_rule("keras.dangerous-function", C, "A Keras config makes the loader call a dangerous function",
      "An object of the model config (a Lambda layer's function, any object's module and class) "
      "names os.system, eval and the like, or a Keras gadget: get_file downloads and writes "
      "anywhere (CVE-2025-8747), enable_unsafe_deserialization and a nested load_model switch "
      "safe_mode off (CVE-2025-9906), tf.io writes files.", _KERAS_1550,
      "https://github.com/io-no/CVE-Reports/issues/5")
_rule("keras.foreign-module", H, "A Keras config names a module outside Keras",
      "Keras up to 3.8 imports the module any config object names, and calls function "
      "references, even with safe_mode (CVE-2025-1550); later versions only when the object is "
      "registered. HIGH for a function reference (called), MEDIUM for a class (imported, built).",
      _KERAS_1550, function=H, **{"class": M})
_rule("hdf5.not-parsed", M, "An HDF5 file whose content is not parsed",
      "No Keras model config was found in it (a Keras .h5 carries one), and its datasets and "
      "attributes are not read: PyTables and pandas unpickle object columns and Python "
      "attributes when they read an HDF5 file.")

# --- parser anomalies: kind -> (severity, rationale) ---------------------------------------------------
# Zip sources: picklescan advisories GHSA-w8jq-xcqf-f792 (flag bits), GHSA-7q5r-7gvp-wc82
# (local/central name), CVE-2025-10156 (bad CRC), zipfile/miniz differences documented in zipfmt.
_DISAGREE = "readers (zipfile, miniz, unzip, scanners) see different members"
_LOADER_FAILS = "the format's loader fails on it: broken or crafted, never clean"
_NOTE = "a compatibility note about a format that carries no code"
_LAYOUT = "a layout detail of a file a normal writer can produce"
_ANOMALY_TABLE: dict[str, tuple[Severity, str]] = {
    "zip.duplicate_name": (H, f"two members share a name: {_DISAGREE}"),
    "zip.local_name_mismatch": (H, f"local and central headers name a member differently: {_DISAGREE}"),
    "zip.local_header_mismatch": (M, f"local and central headers disagree: {_DISAGREE}"),
    "zip.compressed_member": (I, "a deflated member: torch writes stored members; still scanned"),
    "zip.encrypted_member": (H, "an encrypted member cannot be scanned"),
    "zip.data_out_of_range": (H, "a member's data lies outside the file"),
    "zip.overlapping_members": (H, f"members share bytes: {_DISAGREE}"),
    "zip.unaccounted_bytes": (M, "bytes that belong to no member can hide a payload"),
    "zip.prepended_bytes": (H, "bytes before the first member: a polyglot head"),
    "zip.trailing_bytes": (M, "bytes after the end record"),
    "zip.multiple_eocd": (H, f"several end records: {_DISAGREE}"),
    "zip.bad_crc": (M, "a CRC mismatch makes some scanners skip the member (CVE-2025-10156)"),
    "zip.cd_count_mismatch": (H, f"the central directory count is wrong: {_DISAGREE}"),
    "zip.non_utf8_name": (L, "a member name that is not UTF-8"),
    "zip.absolute_or_parent_path": (H, "a member path that escapes on extraction"),
    "zip.comment": (L, "an archive comment (room for hidden bytes)"),
    "zip.bad_local_header": (H, f"a local header that does not parse: {_DISAGREE}"),
    "zip.bad_zip64": (M, f"inconsistent zip64 records: {_DISAGREE}"),
    "zip.bad_extra_field": (M, f"a malformed extra field: {_DISAGREE}"),
    "zip.nul_in_name": (H, f"a NUL in a member name: {_DISAGREE}"),
    "zip.stored_size_mismatch": (H, f"stored sizes disagree: {_DISAGREE}"),
    "npy.trailing_bytes": (L, "bytes after the array data (np.load ignores them)"),
    "npz.bad_member": (H, "an npz member that np.load cannot read"),
    "onnx.duplicate_name": (L, "two initializers share a name: runtimes disagree on which is used"),
    "onnx.ignored_data_field": (I, _NOTE), "onnx.ignored_external_data": (I, _NOTE),
    "onnx.no_graph": (I, _NOTE), "onnx.repeated_raw_data": (I, _NOTE), "onnx.segment": (I, _NOTE),
    "onnx.unknown_external_key": (I, _NOTE), "onnx.unknown_field": (I, _NOTE),
    "gguf.invalid_utf8": (I, _NOTE), "gguf.nested_array": (I, _NOTE), "gguf.long_name": (I, _NOTE),
    "gguf.overlap": (L, "two tensors share bytes: readers may disagree"),
    "gguf.trailing_bytes": (I, _NOTE), "gguf.unexpected_offset": (I, _NOTE),
    "safetensors.duplicate_name": (L, "a JSON key given twice: parsers disagree on which wins"),
    "safetensors.duplicate_metadata_key": (L, "a JSON key given twice: parsers disagree on which wins"),
    "safetensors.unknown_field": (I, _NOTE),
    "torch.storage_unreadable": (I, "a storage record that is not read (data-less traced inputs)"),
    "torch.tensor_out_of_storage": (M, f"a tensor past its storage: {_LOADER_FAILS}"),
    "pickle.trailing_bytes": (L, "bytes after the last pickle"),
    "pickle.tensor_out_of_storage": (M, f"a tensor past its storage: {_LOADER_FAILS}"),
    "pickle.tensor_not_rebuilt": (L, "a tensor rebuild the reader could not follow"),
    "pickle.numpy_size_mismatch": (M, f"array bytes do not match the shape: {_LOADER_FAILS}"),
    "pickle.nested_unreadable": (H, "a nested payload could not be read, so it is not scanned"),
    "pickle.numpy_unreadable": (L, "an array whose data the reader cannot locate (listed without it)"),
    "joblib.array_not_listed": (I, "a joblib array of objects, strings or records, which is not "
                                   "a tensor: said rather than dropped; its pickle is judged"),
    "joblib.sibling_array": (M, "a joblib < 0.10 sibling array file that is missing, compressed or "
                                "outside the pickle's folder: joblib.load fails or reads elsewhere"),
    "torch.unknown_dtype": (I, "a dtype a newer torch writes, listed with its raw bytes"),
    "legacy.duplicate_storage_key": (L, "two storages share a key: the last one wins"),
    "legacy.object_missing": (M, f"a referenced object is missing: {_LOADER_FAILS}"),
    "legacy.storage_missing": (M, f"a referenced storage is missing: {_LOADER_FAILS}"),
    "legacy.storage_size_mismatch": (M, f"a storage record's size disagrees: {_LOADER_FAILS}"),
    "legacy.big_endian": (I, _LAYOUT),
    "legacy.sys_info": (I, _LAYOUT), "legacy.trailing_bytes": (L, "bytes after the last record"),
    "dcp.chunk_coverage": (L, "checkpoint chunks do not cover the tensor"),
    "dcp.trailing_bytes": (L, "bytes after the last checkpoint item"),
    "dcp.transformed_blob": (I, _LAYOUT),
    "pt2.archive_format": (I, _LAYOUT), "pt2.signature_mismatch": (L, "the export signature disagrees"),
    "pt2.storage_dtype_mismatch": (L, "a storage typed twice: readers disagree on its values"),
    "sharded.duplicate_key": (L, "an index key given twice"),
    "sharded.duplicate_tensor": (M, "a tensor in two shards: loaders disagree on which is used"),
    "sharded.extra_shard": (I, _LAYOUT), "sharded.total_size_mismatch": (L, "the index's total size is wrong"),
    "sharded.unmapped_tensor": (L, "a tensor the index does not map"),
    "torchscript.class_without_code": (L, "a TorchScript class without its code"),
    "torchscript.code_unreadable": (H, "a TorchScript code file that cannot be read, so not scanned"),
    "torchscript.module_cycle": (M, "a module hierarchy with a cycle: loaders recurse forever"),
    "torchscript.too_many_modules": (M, "more modules than the reader follows: the rest are not read"),
    "onnx.external_path_escape": (H, "see onnx.external-data-escape"),
}


def anomaly_rule(kind: str) -> str:
    """The rule id of a parser anomaly kind (``zip.bad_crc`` -> ``zip.bad-crc``)."""
    return _ANOMALY_RULE_IDS.get(kind) or kind.replace("_", "-")


_ANOMALY_RULE_IDS = {"onnx.external_path_escape": "onnx.external-data-escape"}

ANOMALIES: dict[str, str] = {}
for _kind, (_sev, _why) in _ANOMALY_TABLE.items():
    _rid = anomaly_rule(_kind)
    ANOMALIES[_kind] = _rid
    if _rid not in RULES:
        _rule(_rid, _sev, f"Reader anomaly {_kind}", _why[:1].upper() + _why[1:] + ".")


def severity_of(rule: str, variant: str | None = None) -> Severity:
    """The declared severity of ``rule`` (in context ``variant``). KeyError for an undeclared rule."""
    r = RULES[rule]
    return r.variants[variant] if variant is not None else r.severity


def listing() -> list[tuple[str, str, str, str]]:
    """(id, severity, title, variants) of every rule, worst first then by id."""
    out = []
    for r in sorted(RULES.values(), key=lambda r: (-int(r.severity), r.id)):
        var = ", ".join(f"{k}={v}" for k, v in r.variants.items()) if r.id != "pickle.findings-capped" else ""
        out.append((r.id, str(r.severity), r.title, var))
    return out
