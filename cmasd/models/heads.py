"""What the heads trained on a frozen verifier share: SpecBound's exit heads
(``cmasd.models.exit_heads``) and blockwise parallel decoding's heads
(``cmasd.models.blockwise_heads``).

In training such a model reads its verifier (``--verifier-path``), frozen and in eval mode,
kept outside the module tree: fairseq-train neither trains nor saves it. The checkpoint
keeps the verifier's fingerprint (``verifier_fingerprint``, a sha256 of its weights) and
what the heads' shapes need (``verifier_shape``), so that trained heads load without the
verifier file and decoding refuses a verifier they were not trained for
(``check_verifier``).
"""

import hashlib
import json
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.models import BaseFairseqModel
from torch import Tensor

from cmasd.errors import UsageError
from cmasd.models.verifier import load_verifier


@dataclass
class HeadsConfig(FairseqDataclass):
    verifier_path: str = field(
        default="",
        metadata={"help": "checkpoint of the verifier the heads read (required for training; frozen, not saved "
                  "with the heads)"},
    )
    verifier_fingerprint: str = field(
        default="", metadata={"help": "set automatically, do not pass: sha256 of the verifier's weights"}
    )
    verifier_shape: str = field(
        default="", metadata={"help": "set automatically, do not pass: the verifier's dimensions the heads need (JSON)"}
    )


def verifier_fingerprint(verifier) -> str:
    """sha256 (hex) of a verifier's parameters, names and values, in float32."""
    digest = hashlib.sha256()
    for name, param in sorted(verifier.state_dict().items()):
        digest.update(name.encode("utf-8"))
        digest.update(param.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


class HeadsOfVerifier(BaseFairseqModel):
    """Heads on a frozen verifier. A subclass sets ``recipe`` (the data-prep script that
    trains it, for messages), defines ``shape(verifier)`` (the dimensions it is built with,
    saved as ``verifier_shape``) and builds itself in ``__init__(cfg, shape, verifier)``."""

    recipe = ""
    supported_targets = ("future",)  # fairseq's language_modeling task checks its targets against these

    def __init__(self, cfg: HeadsConfig, verifier=None):
        super().__init__()
        self.cfg = cfg
        self._verifier: List = [verifier]  # a list: not a submodule

    @staticmethod
    def shape(verifier) -> Dict[str, int]:
        raise NotImplementedError

    @classmethod
    def build_model(cls, cfg: HeadsConfig, task):
        """Training: the verifier of ``--verifier-path``, frozen, its fingerprint recorded.
        Loading trained heads: their saved shape, no verifier."""
        if cfg.verifier_fingerprint:
            return cls(cfg, json.loads(cfg.verifier_shape))
        verifier, _ = load_verifier(cfg.verifier_path, task)
        verifier.eval()
        for param in verifier.parameters():
            param.requires_grad_(False)
        shape = cls.shape(verifier)
        cfg.verifier_fingerprint = verifier_fingerprint(verifier)
        cfg.verifier_shape = json.dumps(shape, sort_keys=True)
        return cls(cfg, shape, verifier)

    @property
    def verifier(self):
        verifier = self._verifier[0]
        if verifier is None:
            raise ValueError(f"{type(self).__name__} was loaded without its verifier: it decodes with it")
        return verifier

    def check_verifier(self, verifier, where: str) -> None:
        """Refuse a verifier other than the one the heads were trained for."""
        theirs = verifier_fingerprint(verifier)
        if self.cfg.verifier_fingerprint != theirs:
            raise UsageError(
                f"{where}: these heads were trained for another verifier (fingerprint "
                f"{self.cfg.verifier_fingerprint[:16]}, this verifier's {theirs[:16]}): train heads for this "
                f"verifier ({self.recipe})"
            )

    def check_dictionary(self, dictionary) -> None:
        """Nothing to check here: the verifier's fingerprint (``check_verifier``) covers its
        embeddings, and so its dictionary."""

    def teacher_forced(self, src_tokens: Tensor, src_lengths: Optional[Tensor] = None,
                       prev_output_tokens: Optional[Tensor] = None) -> Tuple[Tensor, Dict]:
        """The frozen verifier's decoder features (what its output projection reads) (B, T, C)
        and fairseq's extra outputs (``inner_states``: every layer's states, (T, B, C) each).
        A language model's batch has no ``prev_output_tokens``: its decoder reads
        ``src_tokens`` (fairseq's ``language_modeling`` samples)."""
        verifier = self.verifier
        if next(verifier.parameters()).device != src_tokens.device:
            verifier.to(src_tokens.device)
        with torch.no_grad():
            if prev_output_tokens is None:
                if getattr(verifier, "encoder", None) is not None:
                    raise ValueError("an encoder-decoder verifier's heads train on batches with prev_output_tokens")
                return verifier.decoder.extract_features(src_tokens, encoder_out=None)
            encoder_out = verifier.encoder(src_tokens, src_lengths=src_lengths)
            return verifier.decoder.extract_features(prev_output_tokens, encoder_out=encoder_out)

    def max_positions(self):
        """The verifier's (training): the heads themselves read any position."""
        return self.verifier.max_positions()

    def max_decoder_positions(self) -> int:
        """No limit of their own: decoding is bounded by the verifier's positions."""
        return 1 << 30
