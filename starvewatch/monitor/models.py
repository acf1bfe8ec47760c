"""Wire models, validated at the collector's boundary (pydantic, strict about numbers)."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..schema import EVENTS_SCHEMA

NonNegInt = Annotated[int, Field(ge=0)]
Name = Annotated[str, Field(min_length=1, max_length=200)]
MAX_BATCH_RECORDS = 50_000


class Strict(BaseModel):
    # NaN and inf are refused everywhere: pydantic accepts them unless told not to.
    model_config = ConfigDict(allow_inf_nan=False, extra="ignore")


class StepColumns(Strict):
    loader: list[Name] = Field(default_factory=list, max_length=MAX_BATCH_RECORDS)
    epoch: list[NonNegInt] = Field(default_factory=list, max_length=MAX_BATCH_RECORDS)
    step: list[NonNegInt] = Field(default_factory=list, max_length=MAX_BATCH_RECORDS)
    start_ns: list[NonNegInt] = Field(default_factory=list, max_length=MAX_BATCH_RECORDS)
    wait_ns: list[NonNegInt] = Field(default_factory=list, max_length=MAX_BATCH_RECORDS)
    compute_ns: list[NonNegInt] = Field(default_factory=list, max_length=MAX_BATCH_RECORDS)
    other_ns: list[NonNegInt] = Field(default_factory=list, max_length=MAX_BATCH_RECORDS)
    batch_size: list[NonNegInt | None] = Field(default_factory=list, max_length=MAX_BATCH_RECORDS)
    gpu_idle_ns: list[NonNegInt | None] = Field(default_factory=list, max_length=MAX_BATCH_RECORDS)

    @model_validator(mode="after")
    def same_length(self) -> "StepColumns":
        lengths = {name: len(getattr(self, name)) for name in type(self).model_fields}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"step columns differ in length: {lengths}")
        return self

    def __len__(self) -> int:
        return len(self.step)


class LoaderTotalsModel(Strict):
    steps: NonNegInt = 0
    epochs: NonNegInt = 0
    wait_ns: NonNegInt = 0
    compute_ns: NonNegInt = 0
    other_ns: NonNegInt = 0
    epoch_end_wait_ns: NonNegInt = 0
    samples: NonNegInt = 0
    samples_known: bool = True
    dropped_records: NonNegInt = 0
    wait_probe_ns: NonNegInt = 0
    wait_probe_cpu_ns: NonNegInt = 0


class LoaderInfo(Strict):
    name: Name
    kind: str | None = None
    config: dict[str, Any] | None = None
    totals: LoaderTotalsModel


class RunInfo(Strict):
    model_config = ConfigDict(allow_inf_nan=False, extra="allow")
    id: Name
    name: Name
    started_at: Annotated[float, Field(ge=0)] | None = None
    ended_at: Annotated[float, Field(ge=0)] | None = None
    host: str | None = None
    rank: NonNegInt = 0
    world_size: Annotated[int, Field(ge=1)] = 1


class DeliveryAccount(Strict):
    """Where each step record of one process went so far (issue 13's account): acknowledged
    by the collector, waiting in the spool, or dropped (counted per reason)."""

    acknowledged: NonNegInt = 0
    spooled: NonNegInt = 0
    dropped: dict[Annotated[str, Field(min_length=1, max_length=100)], NonNegInt] = Field(
        default_factory=dict, max_length=100)


class EventBatch(Strict):
    """One sequence-numbered batch from one process stream (`starvewatch.events/1`)."""

    schema_: Literal[EVENTS_SCHEMA] = Field(alias="schema")
    run_id: Name
    rank: NonNegInt = 0
    stream: Name
    seq: Annotated[int, Field(ge=1)]
    sent_at_ns: NonNegInt | None = None
    status: Literal["live", "finished"] = "live"
    run: RunInfo | None = None
    loaders: list[LoaderInfo] = Field(default_factory=list, max_length=1000)
    steps: StepColumns = Field(default_factory=StepColumns)
    phases: list[tuple[Name, NonNegInt, NonNegInt, Name, NonNegInt]] = Field(
        default_factory=list, max_length=MAX_BATCH_RECORDS * 8)
    samples: list[dict[str, Any]] = Field(default_factory=list, max_length=10_000)
    workers: list[dict[str, Any]] = Field(default_factory=list, max_length=10_000)
    stalls: list[dict[str, Any]] = Field(default_factory=list, max_length=1_000)
    drops: dict[str, NonNegInt] = Field(default_factory=dict)
    # The sending process's delivery account as it stood when this batch left; the collector
    # keeps the one of the highest sequence number per stream.
    delivery: DeliveryAccount | None = None

    @model_validator(mode="after")
    def run_matches(self) -> "EventBatch":
        if self.run is not None and self.run.id != self.run_id:
            raise ValueError(f"run.id {self.run.id!r} differs from run_id {self.run_id!r}")
        return self
