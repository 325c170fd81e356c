"""What the keeper knows of each replica, as gauges a dashboard can show while the service is
still failing to start: the state each replica is in, and the last reason it failed."""

from __future__ import annotations

from grm_service.metrics import ERROR_LABEL_CHARS, Metrics
from grm_service.replicas.pool import ReplicaState


def error_label(message: str) -> str:
    """One line for a label: the message's first line, and its last line when there are more
    (a failed start's message ends with the replica's log tail, whose last line is the error)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if not lines:
        return "unknown"
    text = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return text if len(text) <= ERROR_LABEL_CHARS else text[: ERROR_LABEL_CHARS - 3] + "..."


class ReplicaStatus:
    """Keeps grm_replica_up, grm_replica_state and grm_replica_last_error in step with the
    keeper's view of its replicas."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._errors: dict[str, str] = {}

    def state(self, replica: str, state: ReplicaState) -> None:
        self._metrics.replica_up.labels(replica=replica).set(int(state is ReplicaState.READY))
        for each in ReplicaState:
            self._metrics.replica_state.labels(replica=replica, state=each.value).set(
                int(each is state))

    def error(self, replica: str, message: str) -> None:
        label = error_label(message)
        gauge = self._metrics.replica_error
        previous = self._errors.get(replica)
        if previous is not None and previous != label:
            gauge.labels(replica=replica, error=previous).set(0)
        gauge.labels(replica=replica, error=label).set(1)
        self._errors[replica] = label

    def start_failed(self, replica: str, message: str) -> None:
        self._metrics.start_failures.labels(replica=replica).inc()
        self.error(replica, message)
