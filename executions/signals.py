"""What the executions app tells the apps above it. It knows nothing of who listens."""

from __future__ import annotations

from django.dispatch import Signal

# Sent once an execution's submission has committed (never for a re-submission that created nothing),
# with ``execution``: the record is there for whoever runs executions to claim.
execution_submitted = Signal()

# Sent once a machine's labels changed (committed), with ``machine`` and ``before`` (its labels before): what
# was granted through a label it no longer carries is no longer reachable through it.
machine_labels_changed = Signal()
