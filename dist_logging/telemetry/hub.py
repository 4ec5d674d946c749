"""One Logger's telemetry: node sampling, progress heartbeats, and (rank zero) the endpoint's values.

Built by the Logger on every rank when ``system_metrics_every`` or ``metrics_port`` is set. What runs where:

- every rank: its progress (step, wall time of ``batch_end``'s return) and upload state, published
  by the store line at each beat (:mod:`dist_logging.telemetry.heartbeats`);
- the local-zero rank of each node: a :class:`~dist_logging.telemetry.sampler.NodeSampler` thread,
  whose samples go to the store (O(1) bytes per node per sample);
- rank zero: the node samples (its own, and the others' read from the store once per sample
  period on the sampler's thread) handed to the Logger at the next ``batch_end`` for its
  destinations as ``system/{host}/{metric}``; and, with ``metrics_port``, the endpoint.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Callable, Iterable, Mapping, Optional

from dist_logging.telemetry.exporter import MetricsExporter, Sample, check_host, check_port
from dist_logging.telemetry.heartbeats import RankRecord, StoreBoard
from dist_logging.telemetry.sampler import SYSTEM_METRICS, NodeSample, NodeSampler, check_every

__all__ = ['Telemetry', 'TelemetryOptions', 'check_options']

HOST = socket.gethostname()


class TelemetryOptions:
    """The Logger's telemetry keywords, checked.

    Args:
        system_metrics_every: seconds between node samples, or None (off).
        metrics_port: the endpoint's port on rank zero (0: a free one), or None (off).
        metrics_host: the address the endpoint binds.

    Raises:
        ValueError: a bad value (named).
    """

    def __init__(self, system_metrics_every: Any = None, metrics_port: Any = None, metrics_host: Any = '0.0.0.0'):
        self.system_metrics_every = check_every(system_metrics_every)
        self.metrics_port = check_port(metrics_port)
        self.metrics_host = check_host(metrics_host)

    @property
    def enabled(self) -> bool:
        """Whether anything is on."""
        return self.system_metrics_every is not None or self.metrics_port is not None


def check_options(
    system_metrics_every: Any = None, metrics_port: Any = None, metrics_host: Any = '0.0.0.0'
) -> TelemetryOptions:
    """Check the telemetry keywords (config loading calls it with the keys found).

    Raises:
        ValueError: a bad value (named).
    """
    return TelemetryOptions(system_metrics_every, metrics_port, metrics_host)


_HELP = {
    'step': 'the last batch count the rank completed (Logger.batch_end)',
    'last_progress_age_seconds': 'seconds since the rank last returned from Logger.batch_end (its heartbeat; '
    'resolution: one beat period)',
    'uploads_pending': 'uploads the rank queued that have not landed or failed yet (count)',
    'uploads_pending_bytes': 'bytes of those uploads (bytes)',
    'oldest_pending_upload_age_seconds': 'seconds since the oldest pending upload was queued (0: none pending)',
    'last_committed_checkpoint_step': 'the step of the last checkpoint a CheckpointWriter committed',
    'last_committed_checkpoint_age_seconds': 'seconds since the last checkpoint commit',
    'straggler': '1 when the last rank report calls the rank a chronic straggler, else 0',
    'store_read_ok': '1 when the last scrape read every rank from the rendezvous store in time, 0 when it '
    'served the previous values',
    'gathered': "the latest per-rank value of a metric logged with reduce='gather'",
}


def _help(metric: str) -> str:
    for pattern, meaning in SYSTEM_METRICS.items():
        if pattern == metric or (
            '{i}' in pattern and metric.startswith('gpu') and metric.endswith(pattern.split('{i}')[1])
        ):
            return meaning
    return 'a system metric of the node'


def _prom_name(metric: str) -> str:
    return 'dist_logging_system_' + ''.join(c if c.isalnum() or c == '_' else '_' for c in metric)


class Telemetry:
    """This rank's telemetry for one Logger; see the module docstring.

    Args:
        options: the checked keywords.
        line: the process's store line (``LoggingGroup.store_line()``), None in a world of one.
        rank, world_size, local_rank, node_rank, num_nodes: this process's place in the job.
        uploaders: returns the uploaders whose pending uploads this rank reports.
        checkpoint: (rank zero) returns ``(step, wall time)`` of the last committed checkpoint, or None.
        stragglers: (rank zero) returns ``rank -> 1/0`` from the last rank report, or None when off.
        host: this node's name (default: ``socket.gethostname()``).

    Raises:
        ImportError: psutil (sampling) or prometheus_client (the endpoint) is missing.
        OSError: the endpoint's port is in use.
    """

    def __init__(
        self,
        options: TelemetryOptions,
        line: Any,
        rank: int,
        world_size: int,
        local_rank: int,
        node_rank: int,
        num_nodes: int,
        uploaders: Callable[[], Iterable[Any]],
        checkpoint: Callable[[], Optional[tuple[int, float]]] = lambda: None,
        stragglers: Callable[[], Optional[Mapping[int, int]]] = lambda: None,
        host: Optional[str] = None,
    ):
        self.options = options
        self.host = host or HOST
        self.rank, self.world_size, self.node_rank, self.num_nodes = rank, world_size, node_rank, num_nodes
        self.step = 0
        self.wall = time.time()
        self._uploaders = uploaders
        self._checkpoint = checkpoint
        self._stragglers = stragglers
        self._lock = threading.Lock()
        self._nodes: dict[str, NodeSample] = {}  # host -> latest sample (rank zero)
        self._pending: Optional[dict[str, float]] = None  # system/{host}/{metric} not yet handed to the Logger
        self._gathered: dict[str, dict[int, float]] = {}  # key -> rank -> value (rank zero, summarized gathers)
        self._store_ok = True
        self._node_error: Optional[BaseException] = None
        self.board = StoreBoard(line, rank, world_size, self.record)
        self.sampler: Optional[NodeSampler] = None
        self.exporter: Optional[MetricsExporter] = None
        try:
            if options.metrics_port is not None and rank == 0:
                self.exporter = MetricsExporter(options.metrics_host, options.metrics_port, self.samples)
            if options.system_metrics_every is not None and (local_rank == 0 or rank == 0):
                self.sampler = NodeSampler(options.system_metrics_every, self.host, self._on_sample)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ every rank
    def record(self) -> RankRecord:
        """This rank's current :class:`RankRecord` (any thread)."""
        count, nbytes, oldest = 0, 0, 0.0
        now = time.time()
        for uploader in self._uploaders():
            n, b, age = uploader.pending_stats()
            count, nbytes = count + n, nbytes + b
            if n:
                oldest = min(oldest or now, now - age)
        return RankRecord(self.step, self.wall, self.host, count, nbytes, oldest)

    def batch_end(self, step: int) -> Optional[dict[str, float]]:
        """``batch_end`` returns (training thread): note the progress; on rank zero, the node metrics to emit.

        Returns:
            ``{'system/{host}/{metric}': value}`` taken since the last call, or None.

        Raises:
            RuntimeError: the sampling thread failed.
        """
        self.step, self.wall = step, time.time()
        if self._pending is None and (self.sampler is None or not self.sampler.failed):
            return None
        return self.take_pending()

    def take_pending(self) -> Optional[dict[str, float]]:
        """The node metrics not handed over yet (rank zero), or None.

        Raises:
            RuntimeError: the sampling thread failed.
        """
        if self.sampler is not None:
            self.sampler.check()
        with self._lock:
            pending, self._pending = self._pending, None
        return pending

    def _on_sample(self, sample: NodeSample) -> None:
        """(The sampler's thread.) Publish this node's sample; on rank zero, collect every node's."""
        if self.rank != 0:
            self.board.publish_node(self.node_rank, dict(sample), sample.host, sample.wall)
            return
        samples = [sample]
        if self.num_nodes > 1:
            try:
                for other in self.board.read_nodes(self.num_nodes):
                    if other['host'] != sample.host:
                        read = NodeSample(other['metrics'])
                        read.wall, read.host = other['wall'], other['host']
                        samples.append(read)
            except Exception as exc:  # noqa: BLE001 - the store is slow: this node now, the others next time
                self._node_error = exc
        with self._lock:
            pending = self._pending if self._pending is not None else {}
            for node in samples:
                known = self._nodes.get(node.host)
                if known is not None and known.wall >= node.wall:
                    continue  # nothing new from that node
                self._nodes[node.host] = node
                for metric, value in node.items():
                    pending[f'system/{node.host}/{metric}'] = value
            if pending:
                self._pending = pending

    def note_gathered(self, per_rank: Mapping[str, Mapping[int, float]]) -> None:
        """(Rank zero.) The latest per-rank values of summarized ``reduce='gather'`` keys, for the endpoint."""
        with self._lock:
            self._gathered.update({key: dict(values) for key, values in per_rank.items()})

    # ------------------------------------------------------------------ rank zero: the endpoint's values
    def samples(self) -> list[Sample]:
        """Every value the endpoint serves, read now (on a server thread; bounded by the store read's deadline)."""
        now = time.time()
        records, ok = self.board.read_ranks()
        records[self.rank] = self.record()
        out: list[Sample] = []
        for rank in sorted(records):
            record = records[rank]
            labels = {'rank': str(rank), 'host': record.host}
            out.append(Sample('dist_logging_step', _HELP['step'], labels, float(record.step)))
            out.append(
                Sample(
                    'dist_logging_last_progress_age_seconds',
                    _HELP['last_progress_age_seconds'],
                    labels,
                    max(now - record.wall, 0.0),
                )
            )
        for rank in sorted(records):
            record, labels = records[rank], {'rank': str(rank)}
            out.append(Sample('dist_logging_uploads_pending', _HELP['uploads_pending'], labels, float(record.pending)))
            out.append(
                Sample(
                    'dist_logging_uploads_pending_bytes',
                    _HELP['uploads_pending_bytes'],
                    labels,
                    float(record.pending_bytes),
                )
            )
            age = max(now - record.oldest_wall, 0.0) if record.pending and record.oldest_wall else 0.0
            out.append(
                Sample(
                    'dist_logging_oldest_pending_upload_age_seconds',
                    _HELP['oldest_pending_upload_age_seconds'],
                    labels,
                    age,
                )
            )
        out.append(Sample('dist_logging_store_read_ok', _HELP['store_read_ok'], {}, 1.0 if ok else 0.0))
        with self._lock:
            nodes = list(self._nodes.values())
            gathered = {key: dict(values) for key, values in self._gathered.items()}
        for node in nodes:
            for metric, value in node.items():
                out.append(
                    Sample(
                        _prom_name(metric),
                        f'{_help(metric)} (sampled every {self.options.system_metrics_every:g} s)',
                        {'host': node.host},
                        float(value),
                    )
                )
        checkpoint = self._checkpoint()
        if checkpoint is not None:
            step, wall = checkpoint
            out.append(
                Sample(
                    'dist_logging_last_committed_checkpoint_step',
                    _HELP['last_committed_checkpoint_step'],
                    {},
                    float(step),
                )
            )
            out.append(
                Sample(
                    'dist_logging_last_committed_checkpoint_age_seconds',
                    _HELP['last_committed_checkpoint_age_seconds'],
                    {},
                    max(now - wall, 0.0),
                )
            )
        stragglers = self._stragglers()
        if stragglers is not None:
            for rank in range(self.world_size):
                out.append(
                    Sample(
                        'dist_logging_straggler',
                        _HELP['straggler'],
                        {'rank': str(rank)},
                        float(stragglers.get(rank, 0)),
                    )
                )
        for key in sorted(gathered):
            for rank, value in sorted(gathered[key].items()):
                out.append(Sample('dist_logging_gathered', _HELP['gathered'], {'key': key, 'rank': str(rank)}, value))
        return out

    @property
    def url(self) -> Optional[str]:
        """The endpoint's URL on rank zero, else None."""
        return self.exporter.url if self.exporter is not None else None

    def close(self) -> None:
        """Stop the sampler, the endpoint and the publishing (bounded waits)."""
        self.board.close()
        if self.sampler is not None:
            self.sampler.close()
        if self.exporter is not None:
            self.exporter.close()
