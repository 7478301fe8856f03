from executions.actions import Actor, add_machine
from executions.labels import parse_labels, said
from executions.management.base import ExecutionCommand, require_fits
from executions.models import Backend, Machine


class Command(ExecutionCommand):
    help = "Register a machine: a place where commands run."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--backend", required=True, choices=Backend.values)
        parser.add_argument("--ref", default="", help="container id/name (docker) or tmux socket name")
        parser.add_argument("--scope", default="default", help="owner scope")
        parser.add_argument(
            "--engine",
            default="",
            help="docker only: the engine URL, unix:///PATH, tcp://HOST:PORT, ssh://[USER@]HOST or http(s)://HOST:PORT "
            "(default: the local socket)",
        )

        parser.add_argument(
            "--host",
            default=None,
            help="local and tmux only: the host its processes live on (default: this host, TETHER_HOST)",
        )
        parser.add_argument(
            "--label",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="what it is for (team=payments); access granted to a label reaches it (repeat for more)",
        )
        parser.add_argument(
            "--no-track-commands",
            action="store_true",
            help="start its shells without Tether's shell integration: typed commands are not kept on the record",
        )

    def run(self, *args, **options):
        fields = (("name", "NAME"), ("ref", "--ref"), ("engine", "--engine"), ("scope", "--scope"), ("host", "--host"))
        for field, option in fields:
            if options[field] is not None:
                require_fits(Machine, field, options[field], option)
        machine = add_machine(
            name=options["name"],
            backend=options["backend"],
            ref=options["ref"],
            scope=options["scope"],
            engine=options["engine"],
            host=options["host"],
            track_commands=not options["no_track_commands"],
            labels=parse_labels(options["label"]),
            actor=Actor.command("machine_add"),
        )
        where = f" on host {machine.host}" if machine.host else ""
        labelled = f", labels {said(machine.labels)}" if machine.labels else ""
        self.stdout.write(f"machine {machine.name} ({machine.backend}) added in scope {machine.scope}{where}{labelled}")
