"""cmasd from Python: fairseq's hub interface, decoding speculatively.

::

    from cmasd import from_pretrained

    model = from_pretrained("checkpoints/verifier", drafter_path="checkpoints/drafter.pt",
                            spec_k=5, spec_acceptance="exact")
    model.translate(["A man rides a bike.", "Two dogs play."])  # raw text in, detokenized text out
    model.translate(sentences, spec_k=8, spec_acceptance="cmasd")  # options per call
    model.last_stats.summary()  # tokens per iteration, acceptance, ... of that call

``from_pretrained`` loads a verifier checkpoint with its dictionary (``dict.txt``, or
fairseq-preprocess's ``dict.SRC.txt`` / ``dict.TGT.txt``) and its subword model
(``spm.model``: sentencepiece; ``encoder.json`` + ``vocab.bpe``: GPT-2 BPE) from one
directory, into fairseq's ``GeneratorHubInterface`` (what ``TransformerModel.from_pretrained``
returns) on the ``translation_speculative`` task: ``translate``, ``sample``, ``generate``,
``encode`` and ``decode`` work as in fairseq. Speculative options are keyword arguments
named as the flags (``--spec-k`` -> ``spec_k``), at loading (the defaults of every call) or
per call, beside fairseq's generation options (``max_len_b``, ``no_repeat_ngram_size``,
``sampling``, ...). Without ``drafter_path`` (and no lookup) fairseq's own generator runs.

Every input gets one output, in order: batches cover every sentence, an empty line is
decoded from the end-of-sentence token alone (with a warning), and a line longer than the
model's source positions is cut to fit (with a warning), as ``fairseq-interactive`` under
``--task translation_speculative`` does.

A language model (a checkpoint of fairseq's ``language_modeling`` task, e.g. a
``transformer_lm``) loads the same way, on the ``language_modeling_speculative`` task, with
its ``dict.txt``: ``sample(prompts)`` returns each prompt and its continuation, as fairseq's
``TransformerLanguageModel.from_pretrained(...).sample`` does, and ``drafter_path`` names a
draft language model with the same dictionary::

    lm = from_pretrained("checkpoints/lm", drafter_path="checkpoints/draft-lm/checkpoint_best.pt", spec_k=4)
    lm.sample(["the president said", "a man"], max_len_b=40)

A prompt longer than the model's positions is continued from its last tokens (with a
warning); an empty one from the start token alone (with a warning).
"""

import dataclasses
import os
from typing import Any, Dict, List, Optional

from fairseq import checkpoint_utils
from fairseq.dataclass.configs import GenerationConfig
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.hub_utils import GeneratorHubInterface
from omegaconf import OmegaConf, open_dict

from cmasd.checkpoint import allow_fairseq_checkpoints, require_checkpoint
from cmasd.compat import disable_encoder_fast_path, restore_numpy_compat_long
from cmasd.decoding.stats import DecodeStats
from cmasd.errors import MissingFileError, UsageError
from cmasd.options import SpeculativeDecodingConfig
from cmasd.training.language_model import LanguageModelingSpeculativeConfig, LanguageModelingSpeculativeTask
from cmasd.training.task import TranslationSpeculativeConfig, TranslationSpeculativeTask

SPECULATIVE_OPTIONS = frozenset(f.name for f in dataclasses.fields(SpeculativeDecodingConfig))
GENERATION_OPTIONS = frozenset(f.name for f in dataclasses.fields(GenerationConfig))
CHECKPOINT_NAMES = ("checkpoint_best.pt", "model.pt", "verifier.pt", "checkpoint_last.pt")
LANGUAGE_MODEL_TASKS = ("language_modeling", "language_modeling_speculative")


def from_pretrained(
    model_name_or_path: str,
    checkpoint_file: Optional[str] = None,
    data_name_or_path: Optional[str] = None,
    bpe: Optional[str] = None,
    batch_size: int = 16,
    **options: Any,
) -> "SpeculativeHubInterface":
    """The verifier of ``model_name_or_path`` (a checkpoint file, or a directory holding
    one of ``CHECKPOINT_NAMES`` or ``checkpoint_file``) behind fairseq's hub interface.

    ``data_name_or_path``: the directory of the dictionary (default: the checkpoint's);
    ``bpe``: ``sentencepiece``, ``gpt2`` or ``none`` (default: from the files found beside
    the dictionary); ``batch_size``: sentences per batch; ``options``: speculative options
    (``drafter_path``, ``spec_k``, ...) and fairseq generation options, the defaults of
    every call."""
    allow_fairseq_checkpoints()
    disable_encoder_fast_path()  # stock fairseq 0.12.2 only
    restore_numpy_compat_long()  # numpy >= 2: fairseq's language modelling datasets read numpy.compat.long
    checkpoint = find_checkpoint(model_name_or_path, checkpoint_file)
    data = data_name_or_path or os.path.dirname(checkpoint)
    speculative, generation = split_options(options)
    state = checkpoint_utils.load_checkpoint_to_cpu(checkpoint)
    cfg = state["cfg"] if state.get("cfg") is not None else convert_namespace_to_omegaconf(state["args"])
    language_model = cfg.task.get("_name") in LANGUAGE_MODEL_TASKS
    with open_dict(cfg):
        cfg.task = task_config(cfg.task, data, speculative, language_model)
        cfg.bpe = bpe_config(data, bpe)
        cfg.dataset.batch_size = batch_size
        cfg.dataset.max_tokens = None
        for key, value in generation.items():
            cfg.generation[key] = value
    if language_model:
        dictionary = load_dictionary(data)
        task = HubLanguageModelTask(cfg.task, dictionary, dictionary, targets=["future"])
    else:
        task = HubTask(cfg.task, *load_dictionaries(data, cfg.task.source_lang, cfg.task.target_lang))
    models, _ = checkpoint_utils.load_model_ensemble([checkpoint], task=task, state=state)
    return SpeculativeHubInterface(cfg, task, models)


def find_checkpoint(model_name_or_path: str, checkpoint_file: Optional[str]) -> str:
    """The checkpoint file that ``from_pretrained``'s first two arguments name."""
    if os.path.isfile(model_name_or_path) and checkpoint_file is None:
        return model_name_or_path
    if not os.path.isdir(model_name_or_path):
        raise MissingFileError(f"{model_name_or_path}: no such checkpoint file or directory")
    if checkpoint_file is not None:
        return require_checkpoint(os.path.join(model_name_or_path, checkpoint_file), "checkpoint_file")
    for name in CHECKPOINT_NAMES:
        if os.path.isfile(os.path.join(model_name_or_path, name)):
            return os.path.join(model_name_or_path, name)
    raise MissingFileError(f"{model_name_or_path}: no checkpoint in it ({', '.join(CHECKPOINT_NAMES)}); "
                           "name one with checkpoint_file=")


def split_options(options: Dict[str, Any]):
    """(speculative options, fairseq generation options) of keyword arguments; any other
    name is refused."""
    unknown = sorted(set(options) - SPECULATIVE_OPTIONS - GENERATION_OPTIONS)
    if unknown:
        raise UsageError(f"unknown option(s) {', '.join(unknown)}: expected speculative options "
                         f"({', '.join(sorted(SPECULATIVE_OPTIONS))}) or fairseq's generation options")
    speculative = {k: v for k, v in options.items() if k in SPECULATIVE_OPTIONS}
    return speculative, {k: v for k, v in options.items() if k not in SPECULATIVE_OPTIONS}


def task_config(trained, data: str, speculative: Dict[str, Any], language_model: bool = False):
    """The ``translation_speculative`` config (``language_modeling_speculative`` for a
    ``language_model``) of a checkpoint trained with ``trained`` (the translation or
    language modelling task's config, or the speculative one's), reading ``data``, with
    ``speculative``."""
    cfg = OmegaConf.structured(LanguageModelingSpeculativeConfig if language_model else TranslationSpeculativeConfig)
    for key in cfg:
        if key not in ("_name", "seed", "data") and key in trained and key not in SPECULATIVE_OPTIONS:
            cfg[key] = trained[key]
    cfg.data = data
    if not language_model:
        cfg.drafter_cuts = 0  # decoding only
    for key, value in speculative.items():
        cfg[key] = value
    return cfg


def bpe_config(data: str, bpe: Optional[str]):
    """fairseq's BPE config for the subword model found in ``data`` (or the one named)."""
    spm = os.path.join(data, "spm.model")
    gpt2 = os.path.join(data, "encoder.json"), os.path.join(data, "vocab.bpe")
    if bpe is None:
        bpe = "sentencepiece" if os.path.isfile(spm) else "gpt2" if all(map(os.path.isfile, gpt2)) else "none"
    if bpe == "sentencepiece":
        if not os.path.isfile(spm):
            raise MissingFileError(f"bpe='sentencepiece': no sentencepiece model at {spm}")
        return OmegaConf.create({"_name": "sentencepiece", "sentencepiece_model": spm})
    if bpe == "gpt2":
        for path in gpt2:
            if not os.path.isfile(path):
                raise MissingFileError(f"bpe='gpt2': no {os.path.basename(path)} at {path}")
        return OmegaConf.create({"_name": "gpt2", "gpt2_encoder_json": gpt2[0], "gpt2_vocab_bpe": gpt2[1]})
    if bpe == "none":
        return None
    raise UsageError(f"bpe={bpe!r}: expected 'sentencepiece', 'gpt2' or 'none'")


def load_dictionaries(data: str, source_lang: Optional[str], target_lang: Optional[str]):
    """(source, target) dictionaries: fairseq-preprocess's ``dict.SRC.txt`` and
    ``dict.TGT.txt`` in ``data``, else its joined ``dict.txt`` for both."""
    pair = [os.path.join(data, f"dict.{lang}.txt") for lang in (source_lang, target_lang)]
    if source_lang and target_lang and all(map(os.path.isfile, pair)):
        return tuple(TranslationSpeculativeTask.load_dictionary(path) for path in pair)
    joined = os.path.join(data, "dict.txt")
    if not os.path.isfile(joined):
        raise MissingFileError(f"{data}: no dictionary (dict.txt, or {os.path.basename(pair[0])} and "
                               f"{os.path.basename(pair[1])}); name its directory with data_name_or_path=")
    dictionary = TranslationSpeculativeTask.load_dictionary(joined)
    return dictionary, dictionary


def load_dictionary(data: str):
    """A language model's dictionary: ``dict.txt`` in ``data``."""
    path = os.path.join(data, "dict.txt")
    if not os.path.isfile(path):
        raise MissingFileError(f"{data}: no dictionary (dict.txt); name its directory with data_name_or_path=")
    return LanguageModelingSpeculativeTask.load_dictionary(path)


class HubGeneration:
    """A speculative task behind the hub interface, built here (fairseq's registry is not
    needed): a speculative generator returns each call's statistics instead of logging the
    run's at exit, and the generator of the last call is kept for them."""

    log_stats = False
    generator = None

    def build_generator(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None, **kwargs):
        self.generator = super().build_generator(models, args, seq_gen_cls, extra_gen_cls_kwargs, **kwargs)
        return self.generator


class HubTask(HubGeneration, TranslationSpeculativeTask):
    """The ``translation_speculative`` task behind the hub interface."""


class HubLanguageModelTask(HubGeneration, LanguageModelingSpeculativeTask):
    """The ``language_modeling_speculative`` task behind the hub interface."""


class SpeculativeHubInterface(GeneratorHubInterface):
    """fairseq's ``GeneratorHubInterface`` whose calls take cmasd's speculative options
    as keyword arguments, decode greedily by default (``beam=1``: what speculative
    decoding verifies) and keep the decoding statistics of the last call
    (``last_stats``: a ``DecodeStats``, None when fairseq's own generator ran)."""

    def __init__(self, cfg, task: HubGeneration, models):
        super().__init__(cfg, task, models)
        self.last_stats: Optional[DecodeStats] = None

    def translate(self, sentences: List[str], beam: int = 1, verbose: bool = False, **options) -> List[str]:
        """Raw sentences in, detokenized outputs out, one per input, in order."""
        return self.sample(sentences, beam, verbose, **options)

    summarize = translate  # the same call for a summarization model

    def generate(self, tokenized_sentences, beam: int = 1, verbose: bool = False, skip_invalid_size_inputs=False,
                 inference_step_args=None, prefix_allowed_tokens_fn=None, **options):
        """fairseq's ``generate``, with ``options`` split between the task (speculative
        options, for this call) and fairseq's generation options."""
        if skip_invalid_size_inputs:
            raise UsageError("skip_invalid_size_inputs: every input gets an output here; a source longer than "
                             "the model allows is cut to fit, with a warning")
        speculative, generation = split_options(options)
        saved = {key: self.task.cfg[key] for key in speculative}
        try:
            for key, value in speculative.items():
                self.task.cfg[key] = value
            self.task.generator = None
            outputs = super().generate(tokenized_sentences, beam, verbose, False, inference_step_args,
                                       prefix_allowed_tokens_fn, **generation)
        finally:
            for key, value in saved.items():
                self.task.cfg[key] = value
        self.last_stats = getattr(self.task.generator, "stats", None)
        return outputs
