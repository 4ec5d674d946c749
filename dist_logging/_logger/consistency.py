"""Checking that every rank logged the same hyperparameters (``check_consistency=True``).

Cost: one all_gather of a fixed-size tensor ``[digest of all hyperparameters, length
of the per-key report]`` when every rank agrees (the common case); one more
(an all_gather of the padded per-key reports) when some digest differs.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Mapping, Optional

import torch

from dist_logging import dist
from dist_logging._values import format_log_data_value

__all__ = ['check_hyperparameters', 'canonical_json']

_ADDRESS = re.compile(r' at 0x[0-9a-fA-F]+')
_PREVIEW = 80


def canonical_json(value: Any) -> str:
    """A canonical text for ``value``: sorted keys, no spaces; non-JSON values by their logged form.

    Object reprs lose their memory address (``<Foo object at 0x7f..>``) so that equal
    objects on different ranks compare equal.
    """

    def fallback(obj: Any) -> str:
        return _ADDRESS.sub('', format_log_data_value(obj))

    return json.dumps(value, sort_keys=True, separators=(',', ':'), default=fallback)


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=7).digest(), 'big')  # < 2**63


def check_hyperparameters(
    hparams: Mapping[str, Any], group: dist.LoggingGroup
) -> Optional[dict[str, list[dict[str, Any]]]]:
    """Compare ``hparams`` across ranks (a collective: every rank must call it).

    Args:
        hparams: this rank's (already redacted) hyperparameters.
        group: the Logger's logging group.

    Returns:
        On global rank zero, when ranks disagree: hyperparameter name -> one entry per
        distinct value, ``{'ranks': [...], 'value': preview}`` (``value`` is ``None`` for
        ranks that did not log the key), most common value first. Otherwise ``None``.

    Raises:
        DistributedLoggingError: a rank did not take part within the timeout.
    """
    if not group.active:
        return None
    texts = {str(key): canonical_json(value) for key, value in hparams.items()}
    report = {key: [_digest(text), text[:_PREVIEW]] for key, text in texts.items()}
    payload = json.dumps(report, sort_keys=True, separators=(',', ':')).encode()
    overall = _digest(payload.decode())
    header = torch.tensor([overall, len(payload)], dtype=torch.int64)
    gathered = [h.tolist() for h in group.all_gather(header, 'checking hyperparameter consistency')]
    if len({digest for digest, _ in gathered}) == 1:
        return None
    lengths = [length for _, length in gathered]
    blobs = group.all_gather_bytes(payload, max(lengths), lengths, 'comparing hyperparameters across ranks')
    if group.rank != 0:
        return None
    reports = [json.loads(blob) for blob in blobs]
    differences: dict[str, list[dict[str, Any]]] = {}
    for key in sorted(set().union(*reports)):
        by_value: dict[Optional[int], dict[str, Any]] = {}
        for rank, ranks_report in enumerate(reports):
            digest, preview = ranks_report.get(key, (None, None))
            by_value.setdefault(digest, {'ranks': [], 'value': preview})['ranks'].append(rank)
        if len(by_value) > 1:
            differences[key] = sorted(by_value.values(), key=lambda group_: (-len(group_['ranks']), group_['ranks']))
    return differences or None
