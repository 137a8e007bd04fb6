"""Which Paddle is installed, and whether paddle-acp supports it.

Paddle is the user's (never installed by paddle-acp). Importing paddle_acp calls :func:`check` once, which reads
``paddle.__version__`` (never the package metadata: ``paddlepaddle`` vs ``paddlepaddle-gpu``):

* no Paddle, one whose import raises anything, or a version below or between the supported series:
  :class:`~paddle_acp.errors.UnsupportedPaddleError` naming the cause and the range;
* a newer Paddle, a development build (``0.0.0``) or a pre-release of a supported release: accepted with one warning
  (paddle-acp's own checks still raise when something breaks);
* Paddle 2.6.x: legacy IR only, and the CPU generator's engine state cannot be saved (:func:`warn_rng_limit`).
"""

from __future__ import annotations

import logging
from typing import Optional, Tuple

from paddle_acp.errors import CheckpointError, UnsupportedPaddleError

logger = logging.getLogger("paddle_acp")

#: The tested series: (first supported release, first release above the series).
SUPPORTED = (((2, 6, 2), (2, 7, 0)), ((3, 0, 0), (3, 4, 0)))
SUPPORTED_TEXT = "2.6.2 (legacy IR) or 3.0.0 through 3.3.x"
INSTALL_HINT = (
    "install it yourself: `pip install paddlepaddle==3.3.1` (CPU), the matching `paddlepaddle-gpu` "
    "wheel for your CUDA (see paddlepaddle.org.cn), or `pip install paddle-acp[cpu]`"
)

OK, NEWER, DEV, UNSUPPORTED = "ok", "newer", "dev", "unsupported"

_PRE_TAGS = ("a", "b", "c", "rc", "alpha", "beta", "pre", "preview", "dev")

_warned_rng = False


def parse(version: str) -> Optional[Tuple[Tuple[int, int, int], bool]]:
    """``"3.1.1"`` -> ``((3, 1, 1), False)``; the flag is True for pre-releases (``3.0.0rc1``,
    ``3.0.0b2``, ``3.0.0.dev20240101``). ``None`` when the string is not a version."""
    parts = version.strip().split(".", 3)
    nums = []
    rest = ""
    for i, part in enumerate(parts[:3]):
        digits = len(part) - len(part.lstrip("0123456789"))
        if digits == 0:
            rest = "." + ".".join(parts[i:])
            break
        nums.append(int(part[:digits]))
        if digits < len(part):  # "0rc1": the release ends here
            rest = part[digits:] + "".join("." + p for p in parts[i + 1:])
            break
    else:
        rest = "." + parts[3] if len(parts) > 3 else ""
    if len(nums) < 2:
        return None
    release = (nums[0], nums[1], nums[2] if len(nums) > 2 else 0)
    tag = rest.lstrip(".-_").lower()
    return release, any(tag.startswith(t) for t in _PRE_TAGS)


def classify(version: str) -> Tuple[str, str]:
    """``(verdict, message)`` for a Paddle version string; verdict is OK, NEWER, DEV or UNSUPPORTED."""
    parsed = parse(version)
    if parsed is None:
        return UNSUPPORTED, (
            f"installed Paddle reports version {version!r}, which is not a version number; "
            f"paddle-acp supports Paddle {SUPPORTED_TEXT}"
        )
    release, pre = parsed
    if release == (0, 0, 0):
        return DEV, (
            f"installed Paddle is a development build (version {version}); paddle-acp is tested with "
            f"Paddle {SUPPORTED_TEXT} and treats it as a newer Paddle: checkpoints are verified, "
            "but resume has not been tested on this build"
        )
    top = SUPPORTED[-1][1]
    if release >= top:
        return NEWER, (
            f"installed Paddle {version} is newer than the versions paddle-acp is tested with "
            f"({SUPPORTED_TEXT}); it is used, but resume has not been tested on it"
        )
    for low, high in SUPPORTED:
        if low <= release < high:
            if not pre:
                return OK, ""
            return DEV, (
                f"installed Paddle {version} is a pre-release or development build of a supported "
                f"release ({SUPPORTED_TEXT}); it is used, but resume has not been tested on this build"
            )
    return UNSUPPORTED, (
        f"installed Paddle {version} is not supported: paddle-acp supports Paddle {SUPPORTED_TEXT}; "
        f"{INSTALL_HINT}"
    )


def check() -> str:
    """Import Paddle and enforce :func:`classify`'s verdict; returns Paddle's version string."""
    # Paddle 2.6.2's libpaddle.so exports an older zlib: were the system libz first loaded as its dependency,
    # libz would bind to that copy and Python's zlib (and numpy 2.x's numpy.random) crash. Load zlib first.
    import zlib  # noqa: F401

    try:
        import paddle
    except Exception as exc:  # ImportError, a CUDA loader's OSError, a RuntimeError from Paddle's own init, ...
        if isinstance(exc, ModuleNotFoundError) and exc.name in ("paddle", "paddle.base"):
            raise UnsupportedPaddleError(
                f"paddle-acp needs PaddlePaddle, and none is installed in this environment "
                f"(paddle-acp never installs it); it supports Paddle {SUPPORTED_TEXT}: {INSTALL_HINT}"
            ) from exc
        if isinstance(exc, ModuleNotFoundError):
            why = f" (missing module {exc.name!r})"
        else:
            why = "" if isinstance(exc, ImportError) else f" ({type(exc).__name__})"
        raise UnsupportedPaddleError(
            f"Paddle is installed but failed to import{why}: {exc}; paddle-acp supports Paddle {SUPPORTED_TEXT}"
        ) from exc
    version = str(getattr(paddle, "__version__", "unknown"))
    verdict, message = classify(version)
    if verdict == UNSUPPORTED:
        raise UnsupportedPaddleError(message)
    if verdict in (NEWER, DEV):
        logger.warning("%s", message)
    return version


def major() -> int:
    """Paddle's major version (3 for a development build)."""
    import paddle

    parsed = parse(str(paddle.__version__))
    if parsed is None or parsed[0] == (0, 0, 0):
        return 3
    return parsed[0][0]


def pir_refusal(what: str = "this program") -> Optional[str]:
    """The reason PIR (``what``) cannot be checkpointed on this Paddle (2.6: experimental PIR), or ``None``."""
    if major() >= 3:
        return None
    import paddle

    return (
        f"Paddle {paddle.__version__} runs {what} in PIR, which paddle-acp does not support on "
        "Paddle 2.6 (PIR is experimental there); build and run it in the legacy IR, the 2.6 default "
        "(unset FLAGS_enable_pir_api and do not enter paddle.pir_utils.IrGuard), or use Paddle 3.0 or newer"
    )


def refuse_pir_mode() -> None:
    """Raise CheckpointError when checkpointing would start in PIR mode on Paddle 2.6."""
    reason = pir_refusal("the training loop")
    import paddle

    if reason is not None and paddle.framework.in_pir_mode():
        raise CheckpointError(reason)


def warn_rng_limit() -> None:
    """Warn once per process when this Paddle cannot carry the CPU engine state across processes."""
    global _warned_rng
    if _warned_rng:
        return
    from paddle_acp.adapter import rng as rng_state

    if rng_state.carries_cpu_engine():
        return
    import paddle

    _warned_rng = True
    logger.warning(
        "Paddle %s cannot save the CPU random generator's engine state (its GeneratorState keeps "
        "only the seed and offset), so after a resume random ops such as dropout draw a different "
        "random stream than an uninterrupted run would; parameters, optimizer state, LR scheduler, "
        "epoch, NumPy's and Python's RNG are restored exactly. Paddle 3.0 or newer resumes bit-identically",
        paddle.__version__,
    )
