"""The torch releases whose SDPA backend selection :mod:`kvcache.analysing.sdpa.selection` transcribes, as data: per
release only the facts of its rules that differ (:class:`ReleaseRules`), each naming its source and evidence, and the
release's default CUDA wheel (:class:`Wheel`: what a CPU run cannot see); the GPU classes (:data:`GPUS`) and the names
``--kv-gpus`` takes (:func:`gpu_names`, ``t4@2.12``; the installed release, :func:`installed_release`). Pure Python,
no torch import.

Sources read (pytorch/pytorch, ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`` unless said):

- ``001f694aef6f922b4fdf6d27d59162d27bf3df58``: torch 2.14's (it carries PR #191085), the one transcription;
- ``21c3369eded41cbad40b61858013c3312afc6dbb``: an older one (2.5/2.6 era: no cuDNN preference), whose
  ``check_flash_attention_hardware_support``, ``check_mem_efficient_hardware_support`` and
  ``check_cudnn_hardware_support`` check ``check_sm_version<sm80, sm90>`` / ``<sm50, sm90>`` / ``<sm80, sm90>``
  and whose ``check_cudnn_tensor_shapes`` has ``constexpr auto head_dim_limit = 128``;
- stored copies (the project's source index, no commit named) of the 2.9 text (``check_prefer_cudnn_attention`` of
  PR #162073: ``CUDNN_VERSION >= 90900``, ``(major == 9 || major == 10) && !dprops->minor``) and of a 2.10-2.12 text
  (the cuDNN > 9.15.0 preference of #169849), whose ``check_cudnn_tensor_shapes`` read ``auto head_dim_limit = 128;
  // Hopper: head_dim<=256 support with cuDNN >= 9.10.0 if (cudnn_version >= 91000) { ... if (dprops->major == 9 &&
  !dprops->minor) { head_dim_limit = 256; } }`` (the 2.10-2.12 one adds ``if (cudnn_version >= 91100) { ... if
  (dprops->major == 10 && d_qk == 192 && d_v == 128) { head_dim_limit = 192; } }``), and whose
  ``can_use_mem_efficient_attention`` has no ``check_data_ptr_alignment_mem_efficient``;
- the installed torch 2.13.0's own ``torch/include/ATen/native/transformers/sdp_utils_cpp.h``: ``template <bool
  supports_gqa, bool requires_same_num_heads=true> inline bool check_batch_size_and_num_heads_dense``, with no
  ``supports_mqa`` parameter (PR #191085's third).

docs/gpu-backends.md has the table and the limits.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

#: GPU classes by name: (compute capability major, minor). Names accepted by ``--kv-gpus``.
GPUS: dict[str, tuple[int, int]] = {
    "t4": (7, 5), "a10g": (8, 6), "l4": (8, 9), "a100": (8, 0), "h100": (9, 0), "b200": (10, 0),
    "sm75": (7, 5), "sm80": (8, 0), "sm86": (8, 6), "sm89": (8, 9), "sm90": (9, 0), "sm100": (10, 0),
}


@dataclass(frozen=True)
class Wheel:
    """What torch's rules read from the build and the machine that a CPU run cannot see, as the release's default
    CUDA wheel has it (an assumption, named in docs/gpu-backends.md)."""

    cuda: tuple[int, int] = (13, 0)
    cudnn: int = 92000  # cuDNN 9.20.0 (the 2.13 wheel's 9.20.0.48), as versionRuntimeCuDNN() reports it
    cudnn_frontend_d256: bool = True  # CUDNN_FRONTEND_VERSION >= 12400
    cudnn_preferred_env: bool = True  # TORCH_CUDNN_SDPA_DEPRIORITIZED unset


#: the installed torch 2.13's default CUDA wheel: CUDA 13.0, cuDNN 9.20.0.48
WHEEL = Wheel()
#: 2.11 and 2.12: CUDA 13.0 and a cuDNN newer than 9.15.0 (9.15.1 assumed: not read from their wheels)
WHEEL_9151 = Wheel(cudnn=91501)


@dataclass(frozen=True)
class ReleaseRules:
    """The facts of torch's rules that differ between the transcribed releases (:data:`RULES`); everything else is
    the one transcription of :mod:`kvcache.analysing.sdpa.selection`.

    ``efficient_gqa``: ``can_use_mem_efficient_attention`` checks its dense inputs with
    ``check_batch_size_and_num_heads_dense<supports_gqa = true, ..., supports_mqa = true>`` (grouped-query heads under
    ``enable_gqa``, and a single K/V head without it) rather than ``<false>`` (the same number of heads); the same
    release's flash and cuDNN take a single K/V head without ``enable_gqa`` too (pytorch PR #191085).
    ``cudnn_first``: when ``priority_order`` puts cuDNN first (``check_prefer_cudnn_attention``): ``never`` (the
    default order, flash, efficient, math, cuDNN), ``sm90-sm100`` (compute capability 9.0 or 10.0, from a cuDNN of
    9.9 or newer at build time) or ``cudnn-9.15.1`` (a runtime cuDNN newer than 9.15.0 on sm9x/sm10x; with CUDA < 13
    only minor 0 or 3). ``newest_sm``: the upper end of the flash, memory-efficient and cuDNN architecture ranges.
    ``offset_alignment``: ``can_use_mem_efficient_attention`` has ``check_data_ptr_alignment_mem_efficient`` (pytorch
    PR #184258). ``cudnn_head_dims``: the head-dim limit of ``check_cudnn_tensor_shapes``: ``128`` (always 128),
    ``hopper-9.10`` (256 on sm 9.0 with cuDNN 9.10 or newer), ``hopper-9.10+sm10x-192`` (that, and 192 for a 192/128
    head on sm 10.x from cuDNN 9.11), ``frontend-d256`` (256 on sm 9.0/10.x with cuDNN newer than 9.22 and frontend
    1.24; 192 for 192/128 from 9.11). ``wheel``: the release's default CUDA wheel. ``releases``: the releases these
    rules stand for; ``source`` and ``evidence``: where each difference was read, in words."""

    release: str
    releases: str
    efficient_gqa: bool
    cudnn_first: str
    wheel: Wheel
    source: str
    evidence: str
    newest_sm: tuple[int, int] = (12, 1)
    offset_alignment: bool = False
    cudnn_head_dims: str = "frontend-d256"


_READ = "sdp_utils.cpp and sdp_utils_cpp.h at 001f694aef6f922b4fdf6d27d59162d27bf3df58"
_NO_EFFICIENT_GQA = ("efficient without grouped-query heads: the sdp_utils.cpp before pytorch PR #191085 "
                     "(2026-07-25) checks the efficient backend's dense inputs with "
                     "check_batch_size_and_num_heads_dense<false /*supports_grouped_query_attention=*/>")
_NO_ALIGNMENT = ("no storage-offset alignment check: check_data_ptr_alignment_mem_efficient came with pytorch PR "
                 "#184258 (merged 2026-05-18, after 2.12's branch cut: 2.12 was published in May 2026, its release "
                 "blog's Q&A on 2026-05-20), so from 2.13")
_HOPPER_D256 = ("cuDNN takes head dims up to 256 on sm 9.0 (check_cudnn_tensor_shapes: 'Hopper: head_dim<=256 "
                "support with cuDNN >= 9.10.0', before the 9.22/frontend-1.24 rule of 001f694a)")
_PRE_BLACKWELL = ReleaseRules(
    "2.5", "2.5.1 to 2.6", False, "never", Wheel(cuda=(12, 4), cudnn=90100),
    f"{_READ}, less #191085 and #184258; priority_order returning the default order; the architecture ranges and "
    "cuDNN head-dim "
    "limit of 21c3369eded41cbad40b61858013c3312afc6dbb",
    f"{_NO_EFFICIENT_GQA}; {_NO_ALIGNMENT}; flash and cuDNN check check_sm_version<sm80, sm90>, efficient "
    "<sm50, sm90> (21c3369e): a B200 (sm100) falls to math; cuDNN made opt-in after 2.5.0 (pytorch PR #138522, 2.5.1; "
    "2.5.0 itself put cuDNN first on H100, not transcribed)",
    newest_sm=(9, 0), cudnn_head_dims="128")
_PRE_CUDNN_DEFAULT = ReleaseRules(
    "2.7", "2.7 to 2.8", False, "never", Wheel(cuda=(12, 4), cudnn=90100),  # no rule here reads them
    f"{_READ}, less #191085 and #184258; priority_order returning the default order",
    f"{_NO_EFFICIENT_GQA}; {_NO_ALIGNMENT}; cuDNN last in the default order (never reached: math takes every call), "
    "first again by default from 2.9 (PR #162073); the architecture ranges of 001f694a (sm121) assumed",
    cudnn_head_dims="128")
_CUDNN_SM90 = ReleaseRules(
    "2.9", "2.9", False, "sm90-sm100", Wheel(cuda=(12, 8), cudnn=91002),
    f"{_READ}, less #191085 and #184258; check_prefer_cudnn_attention of PR #162073 (cuDNN >= 9.9 at build, "
    "sm90/sm100 minor 0); the 2.9 check_cudnn_tensor_shapes",
    f"{_NO_EFFICIENT_GQA}; {_NO_ALIGNMENT}; {_HOPPER_D256}, so an H100 takes cuDNN for head dims 129-256 with the "
    "wheel's cuDNN 9.10; PR #162073 'Enable cuDNN SDPA by default for SM 9.0, SM 10.0' (2025-09, 'for 2.9')",
    cudnn_head_dims="hopper-9.10")
_CUDNN_9151_OLD_WHEEL = ReleaseRules(
    "2.10", "2.10", False, "cudnn-9.15.1", Wheel(cudnn=91400),  # a cuDNN not newer than 9.15.0: 9.14 assumed
    f"{_READ}, less #191085 and #184258; its check_prefer_cudnn_attention (cuDNN > 9.15.0 at run time, #169849); the "
    "2.10-2.12 check_cudnn_tensor_shapes",
    f"{_NO_EFFICIENT_GQA}; {_NO_ALIGNMENT}; the cuDNN > 9.15.0 preference is in 2.10 but its default wheel's cuDNN is "
    "not newer (transformers PR #48163's reading of sdp_utils.cpp: 'What changes at 2.11 is the bundled cuDNN "
    "crossing the threshold'), so cuDNN is not first",
    cudnn_head_dims="hopper-9.10+sm10x-192")
_CUDNN_9151 = ReleaseRules(
    "2.12", "2.11 to 2.12", False, "cudnn-9.15.1", WHEEL_9151,
    f"{_READ}, less #191085 and #184258; the 2.10-2.12 check_cudnn_tensor_shapes",
    f"{_NO_EFFICIENT_GQA}; {_NO_ALIGNMENT}; {_HOPPER_D256} (likely: the text read is 2.10-2.12's, not a release "
    "tag's), so an H100 takes cuDNN for head dims 129-256",
    cudnn_head_dims="hopper-9.10+sm10x-192")
_CUDNN_9200 = ReleaseRules(
    "2.13", "2.13", False, "cudnn-9.15.1", WHEEL,
    f"{_READ}, less #191085; the installed wheel's own sdp_utils_cpp.h",
    f"{_NO_EFFICIENT_GQA}. Not in 2.13.0: 2.13.0 was published on 2026-07-08 and PR #191085 opened on 2026-07-25; "
    "the installed torch 2.13.0's own sdp_utils_cpp.h declares check_batch_size_and_num_heads_dense<supports_gqa, "
    "requires_same_num_heads> with no supports_mqa, which #191085's callers pass (<supports_gqa, true, "
    "supports_mqa>); its torch/nn/functional.py documents that GQA 'currently works only for Flash_attention and math "
    "kernel on CUDA tensor'. The storage-offset alignment check of PR #184258 is taken to be in 2.13 (merged "
    "2026-05-18, weeks before 2.13.0; the CPU wheel has no sdp_utils.cpp to show it); the default wheel bundles cuDNN "
    "9.20.0.48 (issue 49's reading of that wheel, not read here)",
    offset_alignment=True)
_EFFICIENT_GQA = ReleaseRules(
    "2.14", "2.14", True, "cudnn-9.15.1", WHEEL,
    f"{_READ} (the commit read carries #191085)",
    "pytorch PR #191085 '[SDPA] Add memory-efficient GQA and vmap backward support' (2026-07-25): the efficient "
    "backend's dense check <supports_gqa = true, true, supports_mqa = true> on CUDA; v2.14.1's sdp_utils.cpp and the "
    "torch 2.14 documentation of scaled_dot_product_attention say the same; its wheel assumed as 2.13's",
    offset_alignment=True)

#: the transcribed torch releases (major.minor) and their rules; ``--kv-gpus t4@2.12`` predicts under 2.12's
RULES: dict[str, ReleaseRules] = {
    "2.5": _PRE_BLACKWELL, "2.6": _PRE_BLACKWELL, "2.7": _PRE_CUDNN_DEFAULT, "2.8": _PRE_CUDNN_DEFAULT,
    "2.9": _CUDNN_SM90, "2.10": _CUDNN_9151_OLD_WHEEL, "2.11": _CUDNN_9151, "2.12": _CUDNN_9151,
    "2.13": _CUDNN_9200, "2.14": _EFFICIENT_GQA,
}
#: the torch releases whose rules are transcribed here (major.minor)
TRANSCRIBED = tuple(RULES)


class RulesError(ValueError):
    """An unknown GPU class or a torch release without transcribed rules; one line."""


def gpu_names(text: str) -> list[str]:
    """``"t4,a100,t4@2.12"`` -> names, each once (``class@release``: predicted under that torch release's rules); an
    unknown class or release is a one-line :class:`RulesError` listing the known ones."""
    names = [n.strip().lower() for n in str(text).split(",") if n.strip()]
    if not names:
        raise RulesError(f"--kv-gpus {text!r} names no GPU class; known: {', '.join(GPUS)}")
    for name in names:
        gpu, _, release = name.partition("@")
        if gpu not in GPUS:
            raise RulesError(f"--kv-gpus: unknown GPU class {gpu!r}; known: {', '.join(GPUS)}")
        if "@" in name and release not in RULES:
            raise RulesError(f"--kv-gpus: no SDPA rules transcribed for torch {release!r} ({name}); transcribed: "
                             f"{', '.join(TRANSCRIBED)}")
    return list(dict.fromkeys(names))


def check_release(torch_version: str) -> str:
    """``"2.13"`` for torch ``2.13.0+cpu``; a release whose rules are not transcribed is a one-line
    :class:`RulesError` naming the transcribed ones."""
    release = ".".join(str(torch_version).split("+")[0].split(".")[:2])
    if release not in TRANSCRIBED:
        raise RulesError(f"SDPA backend rules are transcribed for torch {', '.join(TRANSCRIBED)} only; the installed "
                         f"torch is {torch_version}: GPU classes cannot be predicted for it (name a transcribed "
                         "release: t4@2.13)")
    return release


@functools.lru_cache(maxsize=1)
def installed_release() -> str:
    """The installed torch's major.minor (package metadata, no import), whose rules a GPU class without a release
    suffix is predicted under; a release not transcribed is a one-line :class:`RulesError`."""
    import importlib.metadata

    try:
        return check_release(importlib.metadata.version("torch"))
    except importlib.metadata.PackageNotFoundError:
        raise RulesError("torch is not installed: name a transcribed release (t4@2.13)") from None
