"""The ``gemv`` and ``bf16`` kernels' C++ extension: ``csrc/decoding.cpp`` (``pack_panels``
and ``panel_linear``, the linear layer for a few rows on weights packed once, in float32 or
bfloat16; ``FusedDecoder``, a decoder's layers in one call; ``embed_rows``, a decoder's plain
input; ``top1``, the greedy token of each row of a verifier's log-probabilities; ``top_gap``,
SpecDec's top-beta test of a block's drafts; ``ensemble_confidence``, CM-ASD's confidence of a
drafter's logits; ``spec_block_inputs``, a Spec-Drafter pass's inputs), compiled on first use.

``torch.utils.cpp_extension`` builds it once per machine into torch's extension cache
(``$TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``; 30-50 s on two
Zen 3 cores) with ninja and the system's C++ compiler, for AVX2 + FMA. Where it cannot be
built or run (no compiler, another architecture, a CPU without AVX2/FMA) ``load``
says why, and ``--spec-kernels auto`` falls back to the packed oneDNN kernel
(``--spec-drafter-quantize bf16``, which has no other kernel, is refused with the reason).
"""

import contextlib
import functools
import logging
import os
import platform
import time
from typing import Any, Optional, Tuple

logger = logging.getLogger(__name__)

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc", "decoding.cpp")
NAME = "cmasd_decoding_v15"  # a new name when the source's interface changes
# torch's build lock older than this was left by a build that was killed (a build takes
# under a minute; the lock is never released then, and every later process waits on it forever)
STALE_LOCK_SECONDS = 600.0


def cpu_obstacle() -> Optional[str]:
    """Why this CPU cannot run the kernel, or None."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"it is written for x86-64 (AVX2 + FMA), this machine is {platform.machine()}"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return "the CPU's features are unknown (no /proc/cpuinfo)"
    missing = [flag for flag in ("avx2", "fma") if flag not in flags]
    return f"the CPU lacks {' and '.join(missing)}" if missing else None


def build_arguments(verbose: bool = False) -> dict:
    """The arguments of ``torch.utils.cpp_extension.load`` for this extension."""
    return dict(name=NAME, sources=[SOURCE], extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"],
                extra_ldflags=["-fopenmp"], verbose=verbose)


@contextlib.contextmanager
def packaged_ninja():
    """PATH with the ninja of the ``ninja`` package (a dependency) first, while building:
    torch runs whichever ``ninja`` PATH finds, and two ninja versions (a system one and
    the package's, depending on whether the virtual environment's bin is on PATH) read
    each other's build log as foreign and rebuild."""
    try:
        import ninja
    except ImportError:
        yield
        return
    old = os.environ.get("PATH")
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + (old or "")
    try:
        yield
    finally:
        if old is None:
            del os.environ["PATH"]
        else:
            os.environ["PATH"] = old


def clear_stale_lock(path: str, now: Optional[float] = None) -> bool:
    """Delete torch's build lock ``path`` where it is older than ``STALE_LOCK_SECONDS``,
    with a warning naming it; whether it did. torch waits, silently and for ever, while
    the lock exists, and a build that was stopped (Ctrl-C, a killed test run) leaves it.
    A younger lock is kept (another process may be building) and named in a warning."""
    try:
        age = (time.time() if now is None else now) - os.path.getmtime(path)
    except OSError:  # no lock: nothing to wait for
        return False
    if age < STALE_LOCK_SECONDS:
        logger.warning(f"waiting for {path}: another process is building cmasd's C++ kernels (if none is, a build "
                       "that was stopped left it: delete it)")
        return False
    logger.warning(f"deleting {path}, a build lock {age / 60:.0f} minutes old: a build of cmasd's C++ kernels that "
                   "was stopped left it")
    try:
        os.remove(path)
    except FileNotFoundError:  # another process took it away meanwhile
        pass
    except OSError as e:  # not ours to delete: torch will wait on it, as named above
        logger.warning(f"could not delete {path}: {e}")
        return False
    return True


def compile_and_load(verbose: bool = False) -> Any:
    """The extension module, compiled first if its build is missing or out of date (a
    stale build lock deleted first: ``clear_stale_lock``)."""
    from torch.utils import cpp_extension

    build_directory = getattr(cpp_extension, "_get_build_directory", None)  # torch's own, not public: where absent,
    if build_directory is not None:  # torch is left to its lock as it is
        clear_stale_lock(os.path.join(build_directory(NAME, verbose), "lock"))
    with packaged_ninja():
        return cpp_extension.load(**build_arguments(verbose))


_LOADED: Optional[Any] = None  # the module, once ``load`` has loaded it in this process


def loaded() -> Optional[Any]:
    """The extension module where this process has loaded it already (``load``: a
    generator on the ``gemv`` or ``bf16`` kernels), else None; never a build. For the
    kernels whose fallback gives the same results (``top1``, ``top_gap``, ``feed_width``,
    ``idle_observe``) or the same to float tolerance (``ensemble_confidence``: as close as the
    gemv kernels' logits are to torch's)."""
    return _LOADED


@functools.lru_cache(maxsize=None)
def load() -> Tuple[Optional[Any], Optional[str]]:
    """``(the extension module, None)``, or ``(None, why it is unavailable)``; built once
    per machine, loaded once per process."""
    obstacle = cpu_obstacle()
    if obstacle:
        return None, obstacle
    try:
        logger.info(f"loading cmasd's C++ kernels ({os.path.basename(SOURCE)}; compiled on first use, under a minute "
                    "once per machine)")
        module = compile_and_load()
    except (ImportError, OSError, RuntimeError, SystemExit) as e:  # no ninja, no compiler, a failed build
        return None, f"building {os.path.basename(SOURCE)} failed: {type(e).__name__}: {str(e).strip()[-500:]}"
    global _LOADED
    _LOADED = module
    return module, None
