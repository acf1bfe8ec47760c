"""Wire models, validated at the collector's boundary (pydantic, strict about numbers)."""
from __future__ import annotations

from typing import Annotated, Literal

import orjson
from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, ValidationError,
                      create_model, model_validator)

from ...ids import ID_PATTERN, NAME_PATTERN, clean_name
from ...limits import MAX_HOST_CHARS, MAX_LIST_RECORDS, MAX_LOADERS_PER_BATCH
from .json_bounds import FREE_FORM_MAX_STRING_CHARS, free_form_problem
from ...redact import redact_argv
from ...schema import EVENTS_SCHEMA
from ...stats import LoaderTotals

# Bounded so every sum the collector forms stays an exact 64-bit integer (2**53 ns: 104 days).
NonNegInt = Annotated[int, Field(ge=0, le=2**53)]
PER_WORKER_MAX = 512  # hooks/workers.py MAX_WORKERS: a loader's per-worker lists
WallNs = Annotated[int, Field(ge=0, le=2**63 - 1)]  # wall-clock ns since the Unix epoch
Number = Annotated[int | float, Field(ge=-1e300, le=1e300)]
# Shown to people (escaped wherever shown): printable text.
# Cleaned first (ids.clean_name: control, format, separator and private-use characters become
# spaces), as the hooks do: a name never costs a run its data, and never reaches a terminal raw.
Name = Annotated[str, BeforeValidator(lambda v: clean_name(v, "_")), Field(min_length=1, max_length=200, pattern=NAME_PATTERN)]
# Becomes a directory name, a URL segment, part of a file name: a small character set.
Id = Annotated[str, Field(min_length=1, max_length=128, pattern=ID_PATTERN)]
# Text read by a view (a stack, a version string): a string, never markup, never an object.
Text = Annotated[str, Field(max_length=FREE_FORM_MAX_STRING_CHARS)]
Short = Annotated[str, Field(max_length=200)]
# A count or id a view reads as it was sent (typed, bounded; its sign is the sender's business).
Int = Annotated[int, Field(ge=-2**63, le=2**63 - 1)]
# A scalar a view prints as it is (a dataset index, an exit signal): never an object.
Scalar = Annotated[int, Field(ge=-2**63, le=2**63 - 1)] | Annotated[float, Field(ge=-1e300, le=1e300)] | Short
MAX_BATCH_RECORDS = MAX_LIST_RECORDS["steps"]  # starvewatch/limits.py: the hooks keep within it
_NAME = TypeAdapter(Name)


def _name_map(values) -> dict[str, str]:
    """Each distinct name of a column, validated as a Name once, to what it is stored as.

    A batch's name columns repeat a few names (the loaders', the phases') tens of thousands of
    times; validated one by one, Name's cleaning (a Python call a value) cost ~40 ms of a
    20,000-step batch, half of the collector's work on it (issue 41). The same check, per name."""
    out = {}
    for value in set(values):
        try:
            out[value] = _NAME.validate_python(value)
        except ValidationError as exc:
            raise ValueError(f"name {value[:80]!r}: {exc.errors()[0]['msg']}") from None
    return out


def _names(values: list[str]) -> list[str]:
    names = _name_map(values)
    return values if all(k == v for k, v in names.items()) else [names[v] for v in values]


def _phase_names(rows: list[tuple]) -> list[tuple]:
    names = _name_map([row[0] for row in rows] + [row[3] for row in rows])
    if all(k == v for k, v in names.items()):
        return rows
    return [(names[a], b, c, names[d], e) for a, b, c, d, e in rows]


# A column of names (step records' loaders, phases' loaders and names): plain strings, each
# distinct one then validated as a Name (_name_map).
NameColumn = Annotated[list[str], AfterValidator(_names)]


class Strict(BaseModel):
    # NaN and inf are refused everywhere: pydantic accepts them unless told not to.
    model_config = ConfigDict(allow_inf_nan=False, extra="ignore")


class StepColumns(Strict):
    loader: NameColumn = Field(default_factory=list, max_length=MAX_BATCH_RECORDS)
    epoch: list[NonNegInt] = Field(default_factory=list, max_length=MAX_BATCH_RECORDS)
    step: list[NonNegInt] = Field(default_factory=list, max_length=MAX_BATCH_RECORDS)
    start_ns: list[WallNs] = Field(default_factory=list, max_length=MAX_BATCH_RECORDS)
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


# One field per LoaderTotals field (starvewatch/stats.py, where the list is written): a count
# is a bounded non-negative integer, a flag a bool, each with the dataclass's default; a
# per-worker list (issue 38: where the waits went) holds at most PER_WORKER_MAX counts.
def _totals_field(spec) -> tuple:
    if spec.default_factory is list:
        return list[NonNegInt], Field(default_factory=list, max_length=PER_WORKER_MAX)
    return (bool if isinstance(spec.default, bool) else NonNegInt), spec.default


LoaderTotalsModel = create_model(
    "LoaderTotalsModel", __base__=Strict,
    **{name: _totals_field(spec) for name, spec in LoaderTotals.__dataclass_fields__.items()})


def _bounded_extras(model: BaseModel) -> None:
    """The free-form part of a record (the fields kept as sent) within json_bounds' limits, and
    inert: an object, or a list holding one, is kept as its JSON text. Every field a view, an
    export or /metrics reads is typed above; what is left is shown (if ever) as text, so a value
    shaped like a Dash component (`{"namespace", "type", "props"}`) can never become one."""
    extra = model.__pydantic_extra__
    for name, value in (extra or {}).items():
        problem = free_form_problem(name, value)
        if problem is not None:
            raise ValueError(problem)
        if isinstance(value, dict) or (isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value)):
            extra[name] = orjson.dumps(value).decode()


class Open(Strict):
    # The fields the collector reads are typed; the rest is kept as sent, within bounds.
    model_config = ConfigDict(allow_inf_nan=False, extra="allow")

    @model_validator(mode="after")
    def bounded_free_form(self):
        _bounded_extras(self)
        return self


class LoaderConfig(Open):
    num_workers: NonNegInt | None = None
    batch_size: NonNegInt | None = None
    prefetch_factor: NonNegInt | None = None
    pin_memory: bool | None = None
    persistent_workers: bool | None = None
    # Read by the diagnosis and the exports (hooks/introspect.py sends them).
    timeout: Number | None = None
    drop_last: bool | None = None
    multiprocessing_context: Short | None = None
    sampler: Short | None = None
    batch_sampler: Short | None = None
    dataset: Short | None = None
    dataset_len: Int | None = None
    collate_fn: Short | None = None
    wrapper: Short | None = None
    worker_method: Short | None = None
    dataset_shards: Int | None = None
    shards_resampled: bool | None = None


class WorkerInfo(Open):
    id: NonNegInt | Name | None = None
    pid: NonNegInt | None = None
    state: Name | None = None
    batches: NonNegInt | None = None
    load_ms_mean: Number | None = None
    cpu_fraction: Number | None = None
    cpu_pct: Number | None = None
    # Read by the views and the worker-memory finding (hooks/samplers.py sends them).
    batches_interval: Int | None = None
    load_ms_interval: Number | None = None
    load_ms_max: Number | None = None
    samples: Int | None = None
    snapshots: Int | None = None
    snapshot_ms_mean: Number | None = None
    snapshot_load_ms: Number | None = None
    snapshot_bytes: Number | None = None
    rss_bytes: Number | None = None
    uss_bytes: Number | None = None
    pss_bytes: Number | None = None
    mem_t_ns: WallNs | None = None
    batch_bytes: Number | None = None
    exit_signal: Short | None = None


class Device(Open):
    name: Name | None = None
    gpu_util_pct: Number | None = None
    mem_used_bytes: Number | None = None
    mem_total_bytes: Number | None = None


class Sample(Open):
    kind: Name | None = None
    t_ns: WallNs | None = None
    cpu_pct: Number | None = None
    process_cpu_pct: Number | None = None
    iowait_pct: Number | None = None
    mem_available_bytes: Number | None = None
    mem_total_bytes: Number | None = None
    swap_in_bytes_per_s: Number | None = None
    swap_out_bytes_per_s: Number | None = None
    disk_read_bytes_per_s: Number | None = None
    shm_used_bytes: Number | None = None
    shm_total_bytes: Number | None = None
    cpu_count: NonNegInt | None = None
    usable_cores: NonNegInt | None = None
    cpu_quota_cores: Number | None = None
    cgroup_cpu_pct: Number | None = None
    cgroup_throttled_pct: Number | None = None
    interval_s: Number | None = None
    cpu_per_core_pct: list[Number | None] | None = Field(None, max_length=100_000)
    devices: list[Device] = Field(default_factory=list, max_length=1000)


class ShardCheck(Strict):
    """shards.compare_readers' answer, as a worker snapshot carries it."""
    compared_batches: NonNegInt
    repeated_batches: NonNegInt
    reads_per_batch: NonNegInt
    workers: NonNegInt


class WorkerSnapshot(Open):
    t_ns: WallNs | None = None
    loader: Name | None = None
    configured_workers: NonNegInt | None = None
    alive_workers: NonNegInt | None = None
    queue_depth: Number | None = None
    queue_capacity: NonNegInt | None = None
    persistent_workers: bool | None = None
    state_dict_calls: Int | None = None
    checkpoint_interval_steps: Number | None = None
    shard_check: ShardCheck | None = None
    shard_hashes: list[list[Annotated[int, Field(ge=-2**63, le=2**64)]]] | None = Field(None, max_length=10_000)
    workers: list[WorkerInfo] = Field(default_factory=list, max_length=10_000)


class Stall(Open):
    t_ns: WallNs | None = None
    loader: Name
    rank: NonNegInt | None = None
    epoch: NonNegInt | None = None
    step: NonNegInt | None = None
    started_ns: WallNs
    ended_ns: WallNs | None = None
    wait_s: Annotated[float, Field(ge=0, le=1e12)]
    workers: list[WorkerInfo] = Field(default_factory=list, max_length=10_000)
    # Who holds the batch (hooks/hang.py): shown on the run page and in the exports, as text.
    phase: Name | None = None
    worker: NonNegInt | None = None
    worker_pid: Int | None = None
    worker_state: Name | None = None
    indices: list[Scalar | None] | None = Field(None, max_length=100_000)
    fetching: bool | None = None
    stack: Text | None = None
    stack_of: Name | None = None


Finite = Annotated[float, Field(ge=-1e300, le=1e300)]


class TuningConfig(Strict):
    """The DataLoader settings live tuning changes (analysis/live_tuning.py TUNED_KEYS)."""
    num_workers: NonNegInt | None = None
    prefetch_factor: NonNegInt | None = None
    persistent_workers: bool | None = None
    pin_memory: bool | None = None
    in_order: bool | None = None


class TuningStepTime(Strict):
    mean_ms: Finite
    sd_ms: Finite
    steps: NonNegInt
    samples_per_step: Finite | None = None


class TuningFigures(Strict):
    step_time: TuningStepTime | None = None
    samples_per_s: Finite | None = None
    batches_per_s: Finite | None = None


class TuningInterval(Strict):
    speedup: Finite
    low: Finite
    high: Finite
    basis: Name


class TuningRecord(Open):
    """One window and decision of live tuning (`starvewatch.live_tuning/1`, hooks/live_tuner.py), or
    a loader's outcome at the run's end (`decision` "outcome": start, final, gain, line)."""
    t_ns: WallNs | None = None
    loader: Name
    schema_: Name | None = Field(None, alias="schema")
    window: NonNegInt | None = None
    windows: NonNegInt | None = None
    decision: Name
    stopped: Text | None = None
    disabled: Text | None = None
    config: TuningConfig | None = None
    next: TuningConfig | None = None
    start: TuningConfig | None = None
    final: TuningConfig | None = None
    figures: TuningFigures | None = None
    interval: TuningInterval | None = None
    gain: TuningInterval | None = None
    advice: list[Name] | None = Field(None, max_length=100)
    done: bool | None = None
    mid_epoch: bool | None = None
    line: Text | None = None


MAX_WORKER_BATCHES = 4096  # hooks/delivery/attribution.py SHIP_PER_BATCH
WorkerBatchNs = Annotated[int, Field(ge=0, le=2**63 - 1)]


class WorkerBatches(Strict):
    """The DataLoader workers' per-batch records read since the last batch (issue 38), as
    columns: wall-clock ns (0: not recorded, e.g. no collate_fn call), for the trace export."""

    loader: list[Name] = Field(default_factory=list, max_length=MAX_WORKER_BATCHES)
    worker: list[Annotated[int, Field(ge=0, lt=PER_WORKER_MAX)]] = Field(default_factory=list, max_length=MAX_WORKER_BATCHES)
    idx: list[NonNegInt] = Field(default_factory=list, max_length=MAX_WORKER_BATCHES)
    wait_start_ns: list[WorkerBatchNs] = Field(default_factory=list, max_length=MAX_WORKER_BATCHES)
    got_ns: list[WorkerBatchNs] = Field(default_factory=list, max_length=MAX_WORKER_BATCHES)
    fetch_start_ns: list[WorkerBatchNs] = Field(default_factory=list, max_length=MAX_WORKER_BATCHES)
    collate_start_ns: list[WorkerBatchNs] = Field(default_factory=list, max_length=MAX_WORKER_BATCHES)
    collate_end_ns: list[WorkerBatchNs] = Field(default_factory=list, max_length=MAX_WORKER_BATCHES)
    done_ns: list[WorkerBatchNs] = Field(default_factory=list, max_length=MAX_WORKER_BATCHES)
    unshipped: NonNegInt = 0  # records past the per-run cap, counted only

    @model_validator(mode="after")
    def same_length(self) -> "WorkerBatches":
        lengths = {n: len(getattr(self, n)) for n in type(self).model_fields if n != "unshipped"}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"worker_batches columns differ in length: {lengths}")
        return self


class LoaderInfo(Strict):
    name: Name
    kind: Short | None = None
    config: LoaderConfig | None = None
    totals: LoaderTotalsModel


class RunInfo(Strict):
    model_config = ConfigDict(allow_inf_nan=False, extra="allow")
    id: Id
    name: Name
    started_at: Annotated[float, Field(ge=0)] | None = None
    ended_at: Annotated[float, Field(ge=0)] | None = None
    host: Annotated[str, Field(max_length=MAX_HOST_CHARS)] | None = None
    rank: NonNegInt = 0
    world_size: Annotated[int, Field(ge=1, le=2**53)] = 1
    # Read by the diagnosis and the exports (hooks/identity.py sends them).
    pid: Int | None = None
    argv: list[Text] | None = Field(None, max_length=10_000)
    python: Short | None = None
    platform: Short | None = None
    torch: Short | None = None
    core: Short | None = None
    cpu_count: Int | None = None
    host_cores: Int | None = None
    usable_cores: Int | None = None
    cpu_quota_cores: Number | None = None
    ram_total_bytes: Number | None = None
    shm_total_bytes: Number | None = None
    local_rank: Int | None = None
    local_world_size: Int | None = None
    restart_count: Int | None = None

    def stored(self) -> dict:
        """What the run's `meta` keeps: the fields sent (typed ones as validated) plus those
        every record has (id, name, times, host, rank, world size)."""
        out = self.model_dump(exclude_unset=True)
        for name in ("started_at", "ended_at", "host", "rank", "world_size"):
            out.setdefault(name, getattr(self, name))
        return out

    @model_validator(mode="after")
    def hide_secrets(self) -> "RunInfo":
        _bounded_extras(self)
        # Hooks from before the redaction, or a hand-made batch: the collector never stores them.
        if self.argv is not None:
            self.argv = redact_argv(self.argv)
        return self


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
    run_id: Id
    rank: NonNegInt = 0
    stream: Id
    seq: Annotated[int, Field(ge=1, le=2**53)]
    sent_at_ns: WallNs | None = None
    status: Literal["live", "finished"] = "live"
    run: RunInfo | None = None
    loaders: list[LoaderInfo] = Field(default_factory=list, max_length=MAX_LOADERS_PER_BATCH)
    steps: StepColumns = Field(default_factory=StepColumns)
    # (loader, epoch, step, phase name, ns): the names checked once each (_phase_names).
    phases: Annotated[list[tuple[str, NonNegInt, NonNegInt, str, NonNegInt]], AfterValidator(_phase_names)] = Field(
        default_factory=list, max_length=MAX_LIST_RECORDS["phases"])
    samples: list[Sample] = Field(default_factory=list, max_length=MAX_LIST_RECORDS["samples"])
    workers: list[WorkerSnapshot] = Field(default_factory=list, max_length=MAX_LIST_RECORDS["workers"])
    stalls: list[Stall] = Field(default_factory=list, max_length=MAX_LIST_RECORDS["stalls"])
    # Live tuning's records (a few per epoch at most): repeated in every part of a split batch,
    # stored from its first part only, as worker_batches.
    tuning: list[TuningRecord] = Field(default_factory=list, max_length=1000)
    drops: dict[str, NonNegInt] = Field(default_factory=dict, max_length=1000)
    # The sending process's delivery account as it stood when this batch left; the collector
    # keeps the one of the highest sequence number per stream.
    delivery: DeliveryAccount | None = None
    # A part of a batch split to fit the limits (starvewatch/batch_parts.py): the records
    # [first, end) of the batch's steps, samples, workers and stalls, counted in that order.
    part: tuple[Annotated[int, Field(ge=0, le=2**53)], Annotated[int, Field(ge=0, le=2**53)]] | None = None
    # The workers' per-batch records (issue 38), stored once per batch (by its first part).
    worker_batches: WorkerBatches | None = None

    def record_range(self) -> tuple[int, int]:
        count = len(self.steps) + len(self.samples) + len(self.workers) + len(self.stalls)
        return self.part if self.part is not None else (0, count)

    @model_validator(mode="after")
    def run_matches(self) -> "EventBatch":
        if self.part is not None and self.part[1] - self.part[0] != \
                len(self.steps) + len(self.samples) + len(self.workers) + len(self.stalls):
            raise ValueError(f"part {list(self.part)} does not match the records it carries")
        for value in (self.run_id, self.stream):
            if set(value) == {"."}:
                raise ValueError(f"{value!r} is not an id (it names a directory)")
        if self.run is not None and self.run.id != self.run_id:
            raise ValueError(f"run.id {self.run.id!r} differs from run_id {self.run_id!r}")
        return self
