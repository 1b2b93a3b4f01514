"""models/<m>/calibration.json: the temperature and the routing policy calibrate fitted."""

from __future__ import annotations

from typing import Any

from reprogate.records.base import Record


class PolicyRecord(Record):
    threshold: float  # act only when the calibrated top-1 probability is at least this
    margin: float  # ... and top-1 minus top-2 is at least this
    # Requests no single intent answers (predict/requests.py); None: the rule is off.
    two_requests: float | None = None  # least confidence of two clauses that name different intents
    ambiguous: float | None = None  # normalised entropy of the probabilities at or above this
    too_short: int | None = None  # at most this many words


class CalibrationRecord(Record):
    temperature: float
    policy: PolicyRecord
    fitted_on: dict[str, Any] | None = None
    limits: dict[str, Any] | None = None
    on_calibration_data: dict[str, Any] | None = None
    warnings: list[str] = []
