"""The benchmarks, by name. Each measures Tether's full path and, in the same run, the baseline it is compared with.

Full path: a WebSocket client -> daphne (consumer) -> Redis (channels-redis) -> owner worker -> PTY /
tmux / docker exec, and back.
"""

from bench.churn_hosts import bench_churn_hosts
from bench.commands import bench_commands
from bench.costs import bench_costs
from bench.endurance import bench_reconnect, bench_recovery, bench_stalled
from bench.heartbeats import bench_heartbeats
from bench.held import bench_holder
from bench.latency import bench_echo, bench_echo_links, bench_echo_loaded, bench_echo_other_layer, bench_layers
from bench.recordings import bench_recordings
from bench.scale import bench_churn, bench_density
from bench.screens import bench_screens
from bench.sessions import Context
from bench.throughput import bench_throughput

__all__ = ["BENCHMARKS", "Context"]

BENCHMARKS = {
    "layers": bench_layers,
    "echo": bench_echo,
    "echo_loaded": bench_echo_loaded,
    "echo_other_layer": bench_echo_other_layer,
    "echo_links": bench_echo_links,
    "throughput": bench_throughput,
    "holder": bench_holder,
    "commands": bench_commands,
    "recordings": bench_recordings,
    "screens": bench_screens,
    "stalled": bench_stalled,
    "reconnect": bench_reconnect,
    "recovery": bench_recovery,
    "density": bench_density,
    "churn": bench_churn,
    "heartbeats": bench_heartbeats,
    "costs": bench_costs,
    "churn_hosts": bench_churn_hosts,
}
