"""What the drafter models take from their verifier: its architecture, its dictionary,
its weights.

A drafter trained for a verifier (the Spec-Drafter, ``spec_drafter``; the autoregressive
draft model, ``ar_drafter``) reads the verifier checkpoint (``--verifier-path``) when it is
built for training: the verifier's dimensions (heads, widths, position embeddings,
normalisation order), a frozen copy of its encoder, its target embeddings and, with
``--decoder-init verifier``, its bottom decoder layers. The architecture is saved in the
drafter's own config (``verifier_arch``) so that a trained drafter loads without the
verifier file, and a digest of the dictionary is saved with the weights so that a drafter
meets no other verifier's dictionary unnoticed (``check_dictionary``).
"""

import copy
import dataclasses
import hashlib
import json
from argparse import Namespace
from typing import Dict, List

import torch
from fairseq import checkpoint_utils, models
from fairseq.models.transformer import TransformerConfig
from omegaconf import OmegaConf

from cmasd.checkpoint import allow_fairseq_checkpoints, require_checkpoint
from cmasd.errors import UsageError


def transformer_keys() -> List[str]:
    """The flat (argparse-style) names ``TransformerConfig.from_namespace`` reads,
    e.g. ``decoder_embed_dim`` for ``cfg.decoder.embed_dim``."""
    keys = []
    defaults = TransformerConfig()
    for fld in dataclasses.fields(defaults):
        value = getattr(defaults, fld.name)
        if dataclasses.is_dataclass(value):
            keys += [f"{fld.name}_{sub.name}" for sub in dataclasses.fields(value)]
        elif not fld.name.startswith("_"):
            keys.append(fld.name)
    return keys


def verifier_arch(model_cfg) -> Dict:
    """The architecture part of a verifier's model config (an argparse ``Namespace``
    or an omegaconf ``DictConfig`` from its checkpoint) as a flat JSON-able dict."""
    if isinstance(model_cfg, Namespace):
        flat = vars(model_cfg)
    else:
        flat = OmegaConf.to_container(model_cfg, resolve=True)
    return {key: flat[key] for key in transformer_keys() if key in flat}


def dictionary_digest(dictionary) -> bytes:
    """sha256 of a fairseq dictionary's symbol list (counts ignored)."""
    return hashlib.sha256("\n".join(dictionary.symbols).encode("utf-8")).digest()


def load_verifier(path: str, task):
    """The verifier of checkpoint ``path`` built with ``task``'s dictionaries, and its
    model config (``Namespace`` or ``DictConfig``)."""
    require_checkpoint(path, "--verifier-path")
    allow_fairseq_checkpoints()
    state = checkpoint_utils.load_checkpoint_to_cpu(path)
    model_cfg = state["cfg"].model
    embed_rows = state["model"].get("decoder.embed_tokens.weight")
    symbols = len(task.target_dictionary)
    # fairseq's pretrained BART (bart.base, bart.large) has one row more, its denoising
    # task's <mask>, which BART's own state-dict upgrade drops on loading
    mask_row = embed_rows is not None and embed_rows.size(0) == symbols + 1 and "<mask>" not in task.target_dictionary
    if embed_rows is not None and embed_rows.size(0) != symbols and not mask_row:
        raise UsageError(
            f"--verifier-path {path}: the verifier has {embed_rows.size(0)} target symbols but "
            f"the data's dictionary has {len(task.target_dictionary)}: binarize the data "
            "with the verifier's dictionary (fairseq-preprocess --srcdict ... --joined-dictionary)"
        )
    verifier = models.build_model(model_cfg, task)
    verifier.load_state_dict(state["model"], strict=True, model_cfg=model_cfg)
    return verifier, model_cfg


def drafter_configs(arch: Dict, cfg):
    """fairseq ``TransformerConfig``s of a drafter with the verifier architecture ``arch``
    and the drafter options ``cfg`` (dropout, decoder layers): (encoder side, decoder side).
    The encoder side is the verifier's; the decoder side has ``cfg.decoder_layers`` layers
    at the verifier's width, tied input/output embeddings and cross-attention."""
    base = TransformerConfig.from_namespace(Namespace(**arch))
    base.dropout = cfg.dropout
    base.attention_dropout = cfg.attention_dropout
    base.activation_dropout = cfg.activation_dropout
    base.checkpoint_activations = False
    base.offload_activations = False
    base.encoder.layerdrop = base.decoder.layerdrop = 0.0
    base.encoder.layers_to_keep = base.decoder.layers_to_keep = None

    dec_cfg = copy.deepcopy(base)
    dec_cfg.decoder.layers = cfg.decoder_layers
    dec_cfg.share_decoder_input_output_embed = True
    dec_cfg.adaptive_softmax_cutoff = None
    dec_cfg.no_cross_attention = False
    dec_cfg.cross_self_attention = False
    return base, dec_cfg


class DrafterOfVerifier:
    """What the drafter models share (mixed into a fairseq encoder-decoder model whose
    ``drafter_cfg`` holds ``verifier_path``, ``verifier_arch``, ``train_encoder``,
    ``decoder_init`` and ``decoder_layers``): building from the verifier, the frozen
    encoder, the dictionary digest.

    A subclass provides ``build(cfg, arch, src_dict, tgt_dict)``, a randomly initialised
    model of the verifier architecture ``arch`` that calls ``record_dictionary(tgt_dict)``,
    and calls ``bind()`` in ``__init__``.
    """

    drafter_cfg = None

    def bind(self) -> None:
        """Freeze the encoder unless it trains; make room for the dictionary digest."""
        self.num_updates = 0
        # sha256 of the target dictionary's symbols: check_dictionary compares it
        self.register_buffer("dictionary_digest", torch.zeros(hashlib.sha256().digest_size, dtype=torch.uint8))
        if not self.drafter_cfg.train_encoder:
            for param in self.encoder.parameters():
                param.requires_grad_(False)
            self.encoder.eval()

    @classmethod
    def build_model(cls, cfg, task):
        """Training: read the verifier checkpoint (``--verifier-path``), take its
        dimensions and initialise from it. Loading a trained drafter: its saved
        ``verifier_arch`` gives the dimensions and the checkpoint the weights."""
        if cfg.verifier_arch:
            model = cls.build(cfg, json.loads(cfg.verifier_arch), task.source_dictionary, task.target_dictionary)
        else:
            verifier, model_cfg = load_verifier(cfg.verifier_path, task)
            arch = verifier_arch(model_cfg)
            cfg.verifier_arch = json.dumps(arch, sort_keys=True)
            model = cls.build(cfg, arch, task.source_dictionary, task.target_dictionary)
            model.init_from_verifier(verifier)
        return model

    def record_dictionary(self, dictionary) -> None:
        """Keep the digest of the target dictionary the drafter is built for (``build`` calls it)."""
        self.dictionary_digest.copy_(torch.tensor(list(dictionary_digest(dictionary)), dtype=torch.uint8))

    @torch.no_grad()
    def init_from_verifier(self, verifier) -> None:
        """Copy the verifier's encoder, target embeddings (and learned positions, input
        layer norm, final layer norm when it has them) and, with ``--decoder-init
        verifier``, its bottom decoder layers."""
        self.encoder.load_state_dict(verifier.encoder.state_dict())
        mine, theirs = self.decoder, verifier.decoder
        mine.embed_tokens.weight.copy_(theirs.embed_tokens.weight)
        for name in ("embed_positions", "layernorm_embedding", "layer_norm"):
            if getattr(mine, name) is not None and getattr(theirs, name) is not None:
                getattr(mine, name).load_state_dict(getattr(theirs, name).state_dict())
        if self.drafter_cfg.decoder_init == "verifier":
            for layer, source in zip(mine.layers, theirs.layers):
                layer.load_state_dict(source.state_dict())

    def train(self, mode: bool = True):
        """A frozen encoder stays in eval mode (no dropout), as at decoding time."""
        super().train(mode)
        if not self.drafter_cfg.train_encoder:
            self.encoder.eval()
        return self

    def set_num_updates(self, num_updates):
        """Record the update count (the Spec-Drafter's glancing schedule reads it)."""
        super().set_num_updates(num_updates)
        self.num_updates = num_updates

    @property
    def uses_own_encoder(self) -> bool:
        """True when the encoder was trained: decode with the drafter's own encoder
        output, not the verifier's."""
        return self.drafter_cfg.train_encoder

    def check_dictionary(self, dictionary) -> None:
        """Refuse a verifier dictionary other than the one the drafter was trained on."""
        theirs = dictionary_digest(dictionary)
        mine = bytes(self.dictionary_digest.tolist())
        size = self.decoder.embed_tokens.num_embeddings
        if mine != theirs or size != len(dictionary):
            raise UsageError(
                f"drafter dictionary ({size} symbols, digest {mine.hex()[:16]}) differs from the "
                f"verifier's ({len(dictionary)} symbols, digest {theirs.hex()[:16]}): train the "
                "drafter on data binarized with the verifier's dictionary"
            )
