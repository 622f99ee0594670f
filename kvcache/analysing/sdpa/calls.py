"""One ``scaled_dot_product_attention`` call as the plain facts torch's SDPA backend rules read
(:class:`TensorFacts`, :class:`SdpaCall`: shapes, strides, storage offsets, dtypes by name, the mask, ``is_causal``,
dropout, ``enable_gqa``) and a backend selection (:class:`Selection`), for :mod:`kvcache.analysing.sdpa.selection`. Pure
Python, no torch import."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TensorFacts:
    """One tensor argument of an SDPA call: ``shape``, ``stride`` (elements), ``offset`` (storage offset, elements),
    ``dtype`` (torch's name without ``torch.``: ``bfloat16``), ``itemsize`` (bytes)."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: str
    itemsize: int

    def to_dict(self) -> dict:
        return {"shape": list(self.shape), "stride": list(self.stride), "offset": self.offset, "dtype": self.dtype,
                "itemsize": self.itemsize}

    @classmethod
    def from_dict(cls, d: dict) -> TensorFacts:
        return cls(tuple(d["shape"]), tuple(d["stride"]), int(d["offset"]), d["dtype"], int(d["itemsize"]))


@dataclass(frozen=True)
class SdpaCall:
    """The parameters of one ``scaled_dot_product_attention`` call that torch's rules read (``sdp_params``)."""

    query: TensorFacts
    key: TensorFacts
    value: TensorFacts
    mask: TensorFacts | None = None
    dropout: float = 0.0
    is_causal: bool = False
    enable_gqa: bool = False
    requires_grad: bool = False

    def to_dict(self) -> dict:
        return {"query": self.query.to_dict(), "key": self.key.to_dict(), "value": self.value.to_dict(),
                "mask": self.mask.to_dict() if self.mask else None, "dropout": self.dropout,
                "is_causal": self.is_causal, "enable_gqa": self.enable_gqa, "requires_grad": self.requires_grad}

    @classmethod
    def from_dict(cls, d: dict) -> SdpaCall:
        mask = d.get("mask")
        return cls(TensorFacts.from_dict(d["query"]), TensorFacts.from_dict(d["key"]),
                   TensorFacts.from_dict(d["value"]), TensorFacts.from_dict(mask) if mask else None,
                   float(d.get("dropout", 0.0)), bool(d.get("is_causal")), bool(d.get("enable_gqa")),
                   bool(d.get("requires_grad")))


@dataclass
class Selection:
    """The backend selected for one call on one GPU class, and {backend ahead of it: torch's words for why not}."""

    backend: str
    rejected: dict[str, str] = field(default_factory=dict)
