"""What an owner worker runs by, read from the settings once when it starts and carried on its context: a
running worker never reads a setting again (restart it to change one), and nothing on its hot path does."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    host: str  # the host this worker says it runs on (TETHER_HOST)
    heartbeat_seconds: float
    lease_ttl_seconds: float
    recovery_seconds: float  # between recovery passes
    viewer_check_seconds: float  # between a viewer's keep-alives: three missed, an observer is forgotten
    reconnect_grace_seconds: float  # a viewer or API reader that went away holds the output back this long
    buffer_bytes: int  # each process's output kept for viewers that come back
    screen_scrollback: int  # lines above a shell's screen its emulator keeps (0: no screens kept)
    flow_high_bytes: int  # a session's output unacknowledged at which reading it pauses...
    flow_low_bytes: int  # ...and at which it resumes
    flow_worker_bytes: int  # the worker's output in flight to all its viewers at once
    layer_message_bytes: int  # the largest channel-layer message
    command_output_bytes: int  # a command's output kept on its record
    recordings: bool
    recording_max_bytes: int
    recording_flush_seconds: float

    @classmethod
    def from_settings(cls) -> WorkerConfig:
        from django.conf import settings

        return cls(
            host=settings.TETHER_HOST,
            heartbeat_seconds=settings.TETHER_HEARTBEAT_SECONDS,
            lease_ttl_seconds=settings.TETHER_LEASE_TTL_SECONDS,
            recovery_seconds=settings.TETHER_RECOVERY_SECONDS,
            viewer_check_seconds=settings.TETHER_VIEWER_CHECK_SECONDS,
            reconnect_grace_seconds=settings.TETHER_RECONNECT_GRACE_SECONDS,
            buffer_bytes=settings.TETHER_BUFFER_BYTES,
            screen_scrollback=settings.TETHER_SCREEN_SCROLLBACK,
            flow_high_bytes=settings.TETHER_FLOW_HIGH_BYTES,
            flow_low_bytes=settings.TETHER_FLOW_LOW_BYTES,
            flow_worker_bytes=settings.TETHER_FLOW_WORKER_BYTES,
            layer_message_bytes=settings.TETHER_LAYER_MESSAGE_BYTES,
            command_output_bytes=settings.TETHER_COMMAND_OUTPUT_BYTES,
            recordings=settings.TETHER_RECORDINGS,
            recording_max_bytes=settings.TETHER_RECORDING_MAX_BYTES,
            recording_flush_seconds=settings.TETHER_RECORDING_FLUSH_SECONDS,
        )
